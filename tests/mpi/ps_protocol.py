"""The PS worker API and server protocol: values, exactly-once, bad input, blocking reads.

Run under mpirun with 4 ranks (2 servers, 2 workers); every rank asserts.
"""

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.ps import (Consistency, Handle, ParamSpec, PSConfigError, PSInputError, PSRefusedError,
                          PSTrainingError, Server, start)
from hpcreduce.ps.protocol import (DTYPES, HEADER_LEN, TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, Op,
                                   Rep, Status, request)
from hpcreduce.ps.stats import merge_summaries
from hpcreduce.train.config import PS, TrainConfig
from hpcreduce.train.ps.ps_training import run_ps_training
from shared_checks import expect

ctx = hpcreduce.init()
comm, rank, size = ctx.comm, ctx.rank, ctx.size
assert size == 4, "run with 4 ranks"
SERVERS, LR = 2, 0.5
SPECS = [ParamSpec("big", (40_000,)), ParamSpec("bias", (3,)),
         ParamSpec("emb", (1000, 4), sparse=True)]
INITIAL = {"big": np.arange(40_000, dtype=np.float32) / 4, "bias": np.array([1, 2, 3], np.float32),
           "emb": np.arange(4000, dtype=np.float32).reshape(1000, 4) / 8}
workers_comm = comm.Split(int(rank >= SERVERS), rank)


def check_bad_settings_fail_everywhere():
    initial = lambda: INITIAL  # noqa: E731
    expect(PSConfigError, "1 <= K < ranks", lambda: start(SPECS, initial, servers=4,
                                                          consistency=Consistency("bsp"), comm=ctx))
    expect(PSConfigError, "1 <= K < ranks", lambda: start(SPECS, initial, servers=0,
                                                          consistency=Consistency("bsp"), comm=ctx))
    lacking = lambda: {"big": INITIAL["big"]}  # noqa: E731
    expect(PSTrainingError,
           "setup failed on rank 0: PSConfigError: the initial values have no table 'bias'",
           lambda: start(SPECS, lacking, servers=2, consistency=Consistency("bsp"), comm=ctx))
    config = TrainConfig(topology=PS(servers=1, consistency="ssp", staleness=1, fetch_every=2))
    expect(PSConfigError, "fetch_every and push_every only apply to consistency asp",
           lambda: run_ps_training(ctx, config, None, None))
    expect(PSConfigError, "servers K needs", lambda: run_ps_training(
        ctx, TrainConfig(topology=PS(servers=4)), None, None))
    comm.Barrier()  # nothing hangs, nothing is left in flight


def raw(server_rank, header, payloads=(), reply_payload=None):
    """Send a hand-made request and return the reply header (for protocol violations)."""
    comm.Send(header, server_rank, TAG_REQUEST)
    for payload in payloads:
        comm.Send(payload, server_rank, TAG_PAYLOAD)
    answer = np.empty(HEADER_LEN, np.int64)
    comm.Recv(answer, server_rank, TAG_REPLY)
    if reply_payload is not None:
        status = MPI.Status()
        comm.Recv(reply_payload, server_rank, TAG_REPLY, status)
        assert status.Get_count(MPI.BYTE) == 0, "a refused pull has an empty payload"
    return answer


def protocol_session():
    """ASP with SGD: values, updates, duplicates, refusals; returns (applied, duplicates, refused)."""
    role = start(SPECS, lambda: INITIAL, servers=SERVERS, consistency=Consistency("asp"), lr=LR, comm=ctx)
    if isinstance(role, Server):
        role.serve()
        return role.state.summary(), None
    worker, w = role, role.slot
    counts = {"applied": 0, "duplicates": 0, "refused": 0}

    def pushed(result):
        counts["applied"] += result.pieces - result.duplicates
        counts["duplicates"] += result.duplicates
        return result

    # Reads: blocking and non-blocking forms give the initial values.
    ids = np.array([999, 3, 500, 0, 42])
    handles = [worker.pull_async("big"), worker.pull_rows_async("emb", ids), worker.pull_async("bias")]
    big, rows, bias = (h.wait() for h in handles)
    assert np.array_equal(big, INITIAL["big"]) and np.array_equal(bias, INITIAL["bias"])
    assert np.array_equal(rows, INITIAL["emb"][ids])
    assert len(worker.layout.placement.pieces[0]) == 2, "big is split over both servers"
    workers_comm.Barrier()  # ASP never waits: no push may land before both workers have read

    # Pushes from both workers, then reads: p - lr * (g0 + g1), exactly.
    g = np.full(40_000, w + 1, np.float32)
    own = np.array([7, 8, 9]) if w == 0 else np.array([9, 10])
    assert pushed(worker.push("big", g)) == (2, 0)
    pushed(worker.push_async("bias", np.ones(3, np.float32)).wait())
    pushed(worker.push_rows("emb", own[::-1], np.ones((len(own), 4), np.float32)))
    worker.clock()
    workers_comm.Barrier()
    assert np.array_equal(worker.pull("big"), INITIAL["big"] - LR * 3)
    assert np.array_equal(worker.pull("bias"), INITIAL["bias"] - LR * 2)
    touched = worker.pull_rows("emb", [7, 8, 9, 10, 11])
    expected = INITIAL["emb"][[7, 8, 9, 10, 11]] - LR * np.array([1, 1, 2, 1, 0])[:, None]
    assert np.array_equal(touched, expected), touched
    workers_comm.Barrier()  # ASP: the other worker's next push of bias must not land before these reads

    # Exactly once: the same (worker, step) again is acknowledged and not applied.
    assert pushed(worker.push("bias", np.ones(3, np.float32))) == (1, 0)
    assert pushed(worker.push("bias", np.ones(3, np.float32))) == (1, 1)
    assert pushed(worker.push_rows("emb", [5], np.ones((1, 4), np.float32))).duplicates == 0
    assert pushed(worker.push_rows("emb", [5], np.ones((1, 4), np.float32))).duplicates == 1
    worker.clock()
    workers_comm.Barrier()
    assert np.array_equal(worker.pull("bias"), INITIAL["bias"] - LR * 4)
    assert np.array_equal(worker.pull_rows("emb", [5])[0], INITIAL["emb"][5] - LR * 2)

    # Key caching: a push naming the rows just pulled sends gradients only; a server that does
    # not hold the list (as after a failure: here the worker names numbers never sent) answers
    # KEYS_UNKNOWN, the worker sends the ids, and exactly the named rows are read and changed.
    mine = np.array([600 + w, 20 + w, 30 + w])
    seen = worker.pull_rows("emb", mine)
    sent = worker.traffic.sent
    assert pushed(worker.push_rows("emb", mine, np.ones((3, 4), np.float32))).duplicates == 0
    assert worker.traffic.sent - sent == 3 * 4 * 4, "cached ids: only the gradients travel"
    for key, (number, listed) in list(worker.sent_keys.last.items()):
        worker.sent_keys.last[key] = (number + 10**9, listed)
    sent = worker.traffic.sent
    assert np.array_equal(worker.pull_rows("emb", mine), seen - LR), "the ids were sent again"
    assert worker.traffic.sent - sent == 3 * 8, "the ids travelled once, in the resent request"
    worker.clock()

    # --wire-dtype float16: values travel rounded to float16 (half the bytes); the servers keep
    # float32 and widen each gradient on arrival.
    exact, rows = worker.pull("big"), worker.pull_rows("emb", mine)
    worker.wire_dtype = np.dtype(np.float16)
    received = worker.traffic.received
    assert np.array_equal(worker.pull("big"), exact.astype(np.float16).astype(np.float32))
    assert worker.traffic.received - received == 40_000 * 2, "float16 on the wire"
    assert np.array_equal(worker.pull_rows("emb", mine), rows.astype(np.float16).astype(np.float32))
    assert pushed(worker.push_rows("emb", mine, np.full((3, 4), 0.5, np.float32))).duplicates == 0
    worker.wire_dtype = None
    assert np.array_equal(worker.pull_rows("emb", mine), rows - LR * 0.5), "a float16 push applied once"
    worker.clock()

    # Bad calls are refused by the worker before anything is sent.
    expect(PSInputError, "unknown table 'nope'; the tables are 'big', 'bias', 'emb'",
           lambda: worker.pull("nope"))
    expect(PSInputError, "has shape (3, 1), the table needs (3,)",
           lambda: worker.push("bias", np.ones((3, 1), np.float32)))
    expect(PSInputError, "has dtype float64, the table needs float32",
           lambda: worker.push("bias", np.ones(3)))
    expect(PSInputError, "row id 1000 out of range [0, 1000)", lambda: worker.pull_rows("emb", [1, 1000]))
    expect(PSInputError, "row id -1 out of range",
           lambda: worker.push_rows("emb", [-1], np.ones((1, 4), np.float32)))
    expect(PSInputError, "ids must be unique",
           lambda: worker.push_rows("emb", [4, 4], np.ones((2, 4), np.float32)))
    expect(PSInputError, "is sparse: use pull_rows/push_rows", lambda: worker.pull("emb"))
    expect(PSInputError, "is dense: use pull/push", lambda: worker.pull_rows("bias", [0]))
    expect(PSInputError, "one-dimensional integer array", lambda: worker.pull_rows("emb", [0.5]))

    # NaN/Inf: the server refuses and counts it, keeps serving the other worker, changes nothing.
    before = worker.pull("big")
    workers_comm.Barrier()
    piece = worker.layout.placement.pieces[0][0]
    if w == 0:
        bad = np.zeros(40_000, np.float32)
        bad[piece.start + 5] = np.nan
        bad[piece.stop:] = 1.0                      # the other server's piece is finite
        text = expect(PSRefusedError, "NaN or Inf", lambda: worker.push("big", bad))
        assert "server rank 0" in text and "server rank 1" not in text, text
        counts["refused"] += 1
        counts["applied"] += 1                      # pieces are applied independently
    else:
        pushed(worker.push("big", np.ones(40_000, np.float32)))
    worker.clock()
    workers_comm.Barrier()
    after = worker.pull("big")
    change = np.full(40_000, LR, np.float32)        # worker 1's push everywhere,
    change[piece.stop:] += LR                       # worker 0's only on server 1's piece
    assert np.array_equal(after, before - change)

    # Hand-made requests that break the protocol: refused with a reason, server keeps going.
    if w == 0:
        header = request(Op.PULL, 99, w, worker.clock_value, 3)
        assert raw(0, header, reply_payload=np.empty(3, np.float32))[Rep.STATUS] == Status.UNKNOWN_TABLE
        header = request(Op.PUSH, 0, w, worker.clock_value, 17, DTYPES.index(np.dtype("float32")))
        answer = raw(1, header, [np.ones(17, np.float32)])
        assert answer[Rep.STATUS] == Status.BAD_SIZE, answer
        foreign = worker.layout.placement.rows_on(2, 1)[:2]
        header = request(Op.PULL_ROWS, 2, w, worker.clock_value, 2, 1, 4)
        answer = raw(0, header, [foreign], reply_payload=np.empty(8, np.float32))
        assert answer[Rep.STATUS] == Status.NOT_OWNER and answer[Rep.DETAIL] == foreign[0], answer
        comm.Send(np.array([42, 0, w, 0, 0, 0, 1, 0, 0], np.int64), 0, TAG_REQUEST)  # unknown op: no reply
        header = request(Op.PULL_ROWS, 2, w, worker.clock_value, 2, 1, 4, keys=10**9, cached=True)
        answer = raw(0, header, reply_payload=np.empty(8, np.float32))
        assert answer[Rep.STATUS] == Status.KEYS_UNKNOWN, answer  # not the worker's fault: not counted
        counts["refused"] += 4
        assert np.array_equal(worker.pull("big"), after), "still serving, nothing changed"
    worker.release()
    return None, counts


def blocked_read_session():
    """SSP(0): a read ahead of the slowest worker waits, while the other worker is served."""
    role = start(SPECS, lambda: INITIAL, servers=SERVERS, consistency=Consistency("ssp", 0), lr=LR, comm=ctx)
    if isinstance(role, Server):
        role.serve()
        return role.state.summary()
    worker = role
    if worker.slot == 0:
        worker.clock()
        worker.clock()
        waiting = worker.pull_async("bias")          # clock 2, the other worker is at 0: waits
        workers_comm.Barrier()
        seen = waiting.wait()
        assert np.array_equal(seen, INITIAL["bias"] - LR * 2), "the read waited for both pushes"
    else:
        workers_comm.Barrier()
        for _ in range(2):
            assert np.array_equal(worker.pull("big")[:3], INITIAL["big"][:3]), "served while the other waits"
            worker.push("bias", np.ones(3, np.float32))
            worker.clock()
    worker.release()
    return None


def push_pull_session():
    """BSP fused push-pull: the reply waits for the step's update (every worker's push in it),
    pushes and clocks queued behind a waiting push-pull are taken, refusals come back with
    empty values, float16 travels both ways."""
    role = start(SPECS, lambda: INITIAL, servers=SERVERS, consistency=Consistency("bsp"), lr=LR, comm=ctx)
    if isinstance(role, Server):
        role.serve()
        return role.state.summary()
    worker, w = role, role.slot

    def step(starts, first):
        """Issue, clock, wait; worker ``first`` issues before the other one has pushed anything."""
        if w != first:
            workers_comm.Barrier()
        handles = [begin() for begin in starts]
        ended = set(worker._ended)
        worker.clock()
        if w == first:
            workers_comm.Barrier()
        step.ended = ended
        return [handle.wait() for handle in handles] if isinstance(handles[0], Handle) else \
            [[h.wait() for h in hs] for hs in handles]

    # Step 0: the dense pieces of 'big' on both servers; 'bias' pushed plainly behind the push-pull.
    g = np.full(40_000, w + 1, np.float32)
    big, _ = step([lambda: worker.push_pull_async("big", g), lambda: worker.push_async("bias", np.ones(3, np.float32))],
                  first=0)
    assert np.array_equal(big, INITIAL["big"] - LR * 3), "the reply waited for both workers' pushes"
    assert np.array_equal(worker.pull("bias"), INITIAL["bias"] - LR * 2)

    # A push-pull of a step already pushed is a duplicate: the values, nothing applied; one
    # with NaN is refused with empty values: nothing changes.
    worker.clock_value -= 1
    assert np.array_equal(worker.push_pull("bias", np.ones(3, np.float32)), INITIAL["bias"] - LR * 2)
    worker.clock_value += 1
    expect(PSRefusedError, "NaN or Inf", lambda: worker.push_pull("bias", np.full(3, np.nan, np.float32)))

    # Step 1: float16 both ways, worker 1 first.
    worker.wire_dtype = np.dtype(np.float16)
    third = np.full(3, 1 / 3, np.float32)
    (bias,) = step([lambda: worker.push_pull_async("bias", third)], first=1)
    worker.wire_dtype = None
    widened = third.astype(np.float16).astype(np.float32)
    exact = (INITIAL["bias"] - LR * 2) - LR * (widened + widened)
    assert np.array_equal(bias, exact.astype(np.float16).astype(np.float32)), (bias, exact)

    # Step 2: both tables at once, the last request to each server ending the step there (no
    # CLOCK follows); a bad gradient in any table is refused before anything is sent.
    expect(PSInputError, "has shape (2,), the table needs (3,)",
           lambda: worker.push_pull_step_async({"big": g, "bias": np.ones(2, np.float32)}))
    both = set(worker.layout.shard_ranks.values())
    step([lambda: worker.push_pull_step_async({"big": g, "bias": np.ones(3, np.float32)})], first=0)
    assert step.ended == both, "the push-pulls ended the step on both servers: clock() sent no CLOCK"
    (big,) = step([lambda: worker.push_pull_async("big", g, ends_step=True)], first=1)
    assert step.ended == both
    assert np.array_equal(big, INITIAL["big"] - LR * 9), "three steps of both workers' gradients"
    exact = exact - LR * 2
    assert np.array_equal(worker.pull("bias"), exact), "the servers keep float32"
    worker.release()
    return None


check_bad_settings_fail_everywhere()
summary, counts = protocol_session()
summaries = comm.allgather(summary)
merged = merge_summaries(summaries, size - SERVERS)
every_count = comm.allgather(counts)
for w, expected in enumerate(c for c in every_count if c):
    pushes = merged["pushes"]
    assert pushes["applied_per_worker"][w] == expected["applied"], (w, pushes, expected)
    assert pushes["duplicates_per_worker"][w] == expected["duplicates"], (w, pushes, expected)
    assert pushes["refused_per_worker"][w] == expected["refused"], (w, pushes, expected)
assert merged["pushes"]["refusals"] == {"NONFINITE": 1, "UNKNOWN_TABLE": 1, "BAD_SIZE": 1,
                                        "NOT_OWNER": 1, "UNKNOWN_OP": 1}, merged["pushes"]
blocked = merge_summaries(comm.allgather(blocked_read_session()), size - SERVERS)
assert blocked["staleness"]["read_max"] == 0, blocked
fused = merge_summaries(comm.allgather(push_pull_session()), size - SERVERS)
assert fused["staleness"]["read_max"] == 0, fused
assert fused["pushes"]["refusals"] == {"NONFINITE": 2}, fused["pushes"]
assert fused["pushes"]["applied_per_worker"] == [9, 9], fused["pushes"]  # big's 2 pieces x3, bias x3
assert fused["pushes"]["duplicates_per_worker"] == [1, 1], fused["pushes"]
if rank == 0:
    print(f"ps protocol: {size} ranks, pushes {merged['pushes']}, blocked-read staleness "
          f"{blocked['staleness']}: all checks passed", flush=True)
