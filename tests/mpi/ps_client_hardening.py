"""Bad input to the PS client and bad models in training: clear errors, usable afterwards, no hang.

Run under mpirun with 3 ranks. Part 1: 2 servers and 1 worker; the worker fuzzes its own
calls (hypothesis): every bad call raises PSInputError before anything is sent, and good
pushes and pulls right after it give exactly the expected values; a worker used after
release() raises at once. Part 2: every rank trains models that break the Model contract
(ring and PS) or return NaN, and must get TrainingError naming the problem.
"""
import dataclasses
import time

import numpy as np
from mpi4py import MPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcreduce
from hpcreduce.errors import PSTrainingError, TrainingError
from hpcreduce.ps import Consistency, ParamSpec, PSInputError, PSRefusedError, Server, start
from hpcreduce.train import PS, ArrayDataset, Model, StepOutput, TrainConfig, train
from hpcreduce.train.ring.ring_steps import RingTrainer

ctx = hpcreduce.init()
comm, rank = ctx.comm, ctx.rank
assert ctx.size == 3, "run with 3 ranks"
LR, STEP = 0.5, 0.25  # SGD: every good push moves each value by exactly -LR * STEP
SPECS = [ParamSpec("big", (5000,)), ParamSpec("w", (3, 4)), ParamSpec("emb", (50, 3), sparse=True),
         ParamSpec("e64", (20,), "float64", sparse=True)]
BY_NAME = {spec.name: spec for spec in SPECS}
INITIAL = {"big": np.arange(5000, dtype=np.float32) / 8, "w": np.arange(12, dtype=np.float32).reshape(3, 4),
           "emb": np.arange(150, dtype=np.float32).reshape(50, 3) / 4, "e64": np.arange(20, dtype=np.float64)}
FUZZ = settings(max_examples=120, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


class Client:
    """The worker, and what its tables must hold (the mirror of every good push)."""

    def __init__(self, worker):
        self.worker = worker
        self.mirror = {name: value.copy() for name, value in INITIAL.items()}

    def good_round(self):
        """Good pushes to every table, clock, then every pull must match the mirror."""
        worker, ids = self.worker, np.array([0, 7, 31, 49])
        for name in ("big", "w"):
            worker.push(name, np.full(BY_NAME[name].shape, STEP, np.float32))
        worker.push_rows("emb", ids, np.full((4, 3), STEP, np.float32))
        worker.push_rows("e64", ids[:2], np.full(2, STEP))
        for name, rows in (("big", slice(None)), ("w", slice(None)), ("emb", ids), ("e64", ids[:2])):
            self.mirror[name][rows] -= LR * STEP
        worker.clock()
        self.check()

    def check(self):
        for name in ("big", "w"):
            assert np.array_equal(self.worker.pull(name), self.mirror[name]), name
        every = np.arange(50)
        assert np.array_equal(self.worker.pull_rows("emb", every), self.mirror["emb"])
        assert np.array_equal(self.worker.pull_rows("e64", every[:20]), self.mirror["e64"])


def bad_out(draw, spec):
    """An output array ``pull`` must refuse: wrong dtype or shape, strided, read-only, a list."""
    kind = draw(st.sampled_from(["dtype", "shape", "strided", "readonly", "list"]))
    if kind == "dtype":
        return np.empty(spec.shape, draw(st.sampled_from([np.float64, np.float16, np.int32, ">f4"])))
    if kind == "shape":
        shape = draw(st.lists(st.integers(0, 6), max_size=3).filter(lambda s: tuple(s) != spec.shape))
        return np.empty(shape, np.float32)
    if kind == "strided":
        if len(spec.shape) > 1:
            return np.empty(spec.shape[::-1], np.float32).T
        return np.empty(2 * spec.shape[0], np.float32)[::2]
    if kind == "readonly":
        out = np.empty(spec.shape, np.float32)
        out.setflags(write=False)
        return out
    return [0.0] * spec.shape[0]


BAD_IDS = st.one_of(
    st.lists(st.integers(50, 2**63 - 1), min_size=1, max_size=3).map(np.array),   # past the end
    st.lists(st.integers(-2**63, -1), min_size=1, max_size=3).map(np.array),      # negative
    st.just(np.array([2**64 - 1], np.uint64)),
    st.lists(st.floats(0, 10), min_size=1, max_size=3).map(np.array),
    st.just(np.zeros((2, 2), np.int64)), st.just(np.array(3)), st.just([True, False]),
    st.just(["a"]), st.just([[1, 2], [3]]), st.just([2**64]), st.just(None))


@st.composite
def bad_call(draw):
    """(what, call) for a call the worker must refuse with PSInputError."""
    kind = draw(st.sampled_from(["table", "kind", "out", "grad", "ids", "repeated", "row_grads"]))
    dense = draw(st.sampled_from(["big", "w"]))
    sparse = draw(st.sampled_from(["emb", "e64"]))
    spec = BY_NAME[dense]
    if kind == "table":
        name = draw(st.one_of(st.text(max_size=5).filter(lambda n: n not in BY_NAME), st.integers(),
                              st.none(), st.lists(st.integers(), max_size=2)))
        op = draw(st.sampled_from(["pull", "push", "pull_rows", "push_rows"]))
        args = {"pull": (name,), "push": (name, np.zeros(3, np.float32)), "pull_rows": (name, [0]),
                "push_rows": (name, [0], np.zeros((1, 3), np.float32))}[op]
        return f"{op} of unknown table {name!r}", lambda w: getattr(w, op)(*args)
    if kind == "kind":
        return f"dense pull of {sparse}", lambda w: w.pull(sparse)
    if kind == "out":
        out = bad_out(draw, spec)
        return f"pull of {dense} into {type(out).__name__}", lambda w: w.pull(dense, out=out)
    if kind == "grad":
        grad = draw(st.sampled_from([np.zeros(spec.shape, np.float64), np.zeros(spec.shape + (1,), np.float32),
                                     np.zeros(spec.shape, np.int64), [0.0] * spec.shape[0]]))
        return f"push to {dense} of {getattr(grad, 'dtype', 'list')}", lambda w: w.push(dense, grad)
    if kind == "ids":
        ids, pull = draw(BAD_IDS), draw(st.booleans())
        if pull:
            return f"pull_rows of {sparse} ids {ids!r}", lambda w: w.pull_rows(sparse, ids)
        grads = np.zeros((len(np.atleast_1d(np.asarray(ids, dtype=object))),) + BY_NAME[sparse].shape[1:])
        return f"push_rows to {sparse} ids {ids!r}", lambda w: w.push_rows(sparse, ids, grads)
    if kind == "repeated":
        ids = draw(st.lists(st.integers(0, 19), min_size=1, max_size=4).map(lambda i: np.array(i + i[:1])))
        grads = np.zeros((len(ids),) + BY_NAME[sparse].shape[1:], BY_NAME[sparse].dtype)
        return f"push_rows to {sparse} repeated ids {ids}", lambda w: w.push_rows(sparse, ids, grads)
    grads = np.zeros((3, 2), np.float32)
    return f"push_rows to {sparse} with grads {grads.shape}", lambda w: w.push_rows(sparse, [1, 2], grads)


def fuzz(client):
    @FUZZ
    @given(bad_call())
    def bad_calls_change_nothing(call):
        what, run = call
        try:
            run(client.worker)
        except PSInputError:
            pass
        else:
            raise AssertionError(f"no PSInputError for {what}")
        client.good_round()

    @FUZZ
    @given(st.lists(st.integers(0, 19), max_size=30),
           st.sampled_from([np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]))
    def good_ids_in_any_order_and_dtype(ids, dtype):
        ids = np.array(ids, dtype)
        assert np.array_equal(client.worker.pull_rows("emb", ids), client.mirror["emb"][ids.astype(np.int64)])

    bad_calls_change_nothing()
    good_ids_in_any_order_and_dtype()


def expect(error, fragments, call):
    try:
        call()
    except error as err:
        assert all(f in str(err) for f in fragments), f"rank {rank}: {fragments} not all in {err}"
        return err
    raise AssertionError(f"rank {rank}: no {error.__name__} for {fragments}")


def check_ps_client():
    role = start(SPECS, lambda: INITIAL, servers=2, consistency=Consistency("asp"), lr=LR, comm=ctx)
    if isinstance(role, Server):
        role.serve()
        return role.state.summary()
    client = Client(role)
    worker = role
    # the finding: a read-only out raised BufferError after sending and broke every later pull
    readonly = np.empty(5000, np.float32)
    readonly.setflags(write=False)
    expect(PSInputError, ["read-only"], lambda: worker.pull("big", out=readonly))
    expect(PSInputError, ["row id 18446744073709551615 out of range"],
           lambda: worker.pull_rows("emb", np.array([3, 2**64 - 1], np.uint64)))
    client.good_round()
    fuzz(client)
    nan = np.full((3, 4), STEP, np.float32)
    nan[1, 2] = np.nan
    expect(PSRefusedError, ["NaN or Inf"], lambda: worker.push("w", nan))  # the server's refusal
    client.check()
    worker.clock()
    client.good_round()
    worker.release()
    for call in (lambda: worker.push("w", nan), lambda: worker.pull("big"), lambda: worker.pull_rows("emb", [1]),
                 lambda: worker.push_rows("emb", [1], np.zeros((1, 3), np.float32)), worker.clock, worker.release):
        began = time.perf_counter()
        expect(PSInputError, ["after its release()"], call)
        assert time.perf_counter() - began < 1.0
    return None


def linear_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    y = (x @ np.arange(4, dtype=np.float32) + 1).astype(np.float32)
    return ArrayDataset("linear", {"x": x[:300], "y": y[:300]}, {"x": x[300:], "y": y[300:]})


class Linear(Model):
    """y ~ x @ w + b; ``spoil(step, grads)`` may break the gradients on ``spoil_rank``."""

    name = "linear"

    def __init__(self, spoil=None, spoil_rank=None):
        self.spoil, self.spoil_rank, self.calls = spoil, spoil_rank, 0

    def param_specs(self):
        return [ParamSpec("w", (4,)), ParamSpec("b", (1,))]

    def init_params(self, seed):
        return {"w": np.zeros(4, np.float32), "b": np.zeros(1, np.float32)}

    def loss_and_grads(self, params, batch):
        error = batch["x"] @ params["w"] + params["b"][0] - batch["y"]
        grads = {"w": batch["x"].T @ error, "b": error.sum(keepdims=True)}
        if self.spoil and self.spoil_rank in (None, rank):
            self.spoil(self.calls, grads)
        self.calls += 1
        return StepOutput(float(0.5 * (error * error).sum()), grads, 0, len(error))


def check_model_errors():
    data = linear_data()
    config = TrainConfig(model="linear", steps=4, batch=30, lr=0.01, seed=1)
    ps_config = TrainConfig(model="linear", steps=4, batch=30, lr=0.01, seed=1,
                            topology=PS(servers=1, consistency="bsp"))
    missing = Linear(lambda step, grads: grads.pop("b"))
    expect(TrainingError, ["step 1", "rank 0", "rank 2", "ModelError", "'linear'", "['b']"],
           lambda: train(missing, data, config, comm=ctx, verbose=False))
    err = expect(PSTrainingError, ["ModelError", "'linear'", "['b']"],
                 lambda: train(missing, data, ps_config, comm=ctx, verbose=False))
    assert isinstance(err, TrainingError) and "KeyError" not in str(err)
    shaped = Linear(lambda step, grads: grads.update(w=grads["w"][:3]), spoil_rank=1)  # one rank only
    err = expect(TrainingError, ["model 'linear' failed on 1 rank(s): rank 1", "'w'", "shape (3,)"],
                 lambda: train(shaped, data, config, comm=ctx, verbose=False))
    assert "rank 0" not in str(err)
    crashing = Linear(lambda step, grads: 1 / 0 if step == 2 else None, spoil_rank=2)
    expect(TrainingError, ["step 3", "rank 2: ZeroDivisionError"],
           lambda: train(crashing, data, config, comm=ctx, verbose=False))
    # pushed as the mean over the global batch of 30: 3e6 / 30 = 1e5, past float16's 65504
    overflowing = Linear(lambda step, grads: grads["w"].__setitem__(0, 3e6) if step == 1 else None, spoil_rank=2)
    wire16 = dataclasses.replace(ps_config, topology=PS(servers=1, consistency="bsp", wire_dtype="float16"))
    expect(PSTrainingError, ["worker rank 2 at step 1", "push to 'w': gradient has values up to 100000,",
                             "past float16's largest, 65504", "finite before the cast"],
           lambda: train(overflowing, data, wire16, comm=ctx, verbose=False))
    expect(TrainingError, ["ModelError", "'linear'", "'b'", "dtype float64"], lambda: train(
        Linear(lambda step, grads: grads.update(b=grads["b"].astype(np.float64))), data, config,
        comm=MPI.COMM_SELF, verbose=False))


def check_nonfinite_ring_gradient_is_refused():
    """NaN from one rank at step 3: refused on every rank, step 3 not applied."""
    def poison(step, grads):
        if step == 2:
            grads["b"][0] = np.inf
    trainer = RingTrainer(ctx, TrainConfig(model="linear", steps=5, batch=30, lr=0.01, seed=1),
                          Linear(poison, spoil_rank=1), linear_data())
    state = trainer.initial_state()
    for _ in range(2):
        trainer.apply(state, trainer.reduce(trainer.compute(state)))
    before = state.copy()
    expect(TrainingError, ["step 3", "parameter 'b'", "NaN or Inf", "not applied"],
           lambda: trainer.reduce(trainer.compute(state)))
    assert state.step == 2 and all(np.array_equal(state.params[k], before.params[k]) for k in state.params)


summary = check_ps_client()
summaries = [s for s in comm.allgather(summary) if s]
refusals = {}
for s in summaries:
    for reason, count in s["refusals"].items():
        refusals[reason] = refusals.get(reason, 0) + count
assert {k: v for k, v in refusals.items() if v} == {"NONFINITE": 1}, refusals  # no bad call reached a server
check_model_errors()
check_nonfinite_ring_gradient_is_refused()
comm.Barrier()
print(f"rank {rank}: ok", flush=True)
