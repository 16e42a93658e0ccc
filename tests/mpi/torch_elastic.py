"""An elastic torch loop through a real SIGKILL and a real growth, under ``hpcreduce launch --ft``
(3 ranks): an MLP with SGD + momentum and a StepLR schedule in ``elastic.State(model=,
optimizer=, scheduler=, sampler=, rng=)``, batches from ``hpcreduce.torch.ElasticSampler``
(a global batch of 12, shared by the ranks there are), gradients summed by
``allreduce_gradients``. Stable id 2 SIGKILLs itself in step 6 between backward and the
reduction; the discovery file asks for 3 ranks, so one rank is spawned after the recovery.
Checks, printed "ok NAME (rank R)": the newcomer got the momentum buffers; at the end every
rank holds the same parameters and momentum, the optimizer steps the model's live parameters,
every sample of both epochs was trained exactly once (counted through the reductions), the
failure's event was detected after the kill and carries the time to the next commit, and
the parameters equal a one-process run without the kill (to summation order).
With a third argument ``zero`` the optimizer is a ``ZeroRedundancyOptimizer`` over SGD + momentum
(its state sharded; the killed rank's slice comes back from its ring neighbour's copy, and the
state is re-sharded over 2 ranks, then 3). With ``zero-first`` the same, but stable id 0 (rank 0)
is killed, and then the discovery file asks for 2 ranks (a leave: the state re-sharded over the
staying ranks) and 3 again (a growth). With ``zero2`` the model is wrapped in
``hpcreduce.torch.DistributedDataParallel`` first, so the optimizer is ZeRO-2 (the gradients
reduce-scattered in backward, 1/N of them kept), and the kill of ``zero`` is survived the same.
With ``zero-gather`` the optimizer is ZeRO-1 and rank 0 SIGKILLs itself inside ``step()`` once its
allgather completed (the survivors' completed too: the step must not be committed anywhere, as it
was not on rank 0); with ``zero-commit`` inside its commit, between the model's snapshot and the
optimizer's (a commit is whole or not at all).
With ``powersgd`` the model is in our DistributedDataParallel with ``powerSGD_hook`` (compressing
from step 3), the optimizer plain SGD: the spawned rank's ``PowerSGDState`` takes the survivors'
(no equality with one process: the compression is lossy; the hook state's step count is checked).
Arguments: DISCOVERY_FILE KILL_LOG [zero | zero-first | zero2 | zero-gather | zero-commit | powersgd]."""
import os
import signal
import sys
import time

import numpy as np
import torch

import hpcreduce
import hpcreduce.torch as hpt
from hpcreduce import elastic
from torch_loop import CLASSES, EPOCHS, FEATURES, SEED, batches, data, one_process_run, relative_gaps, step

SAMPLES = 96
discovery, kill_log = sys.argv[1], sys.argv[2]
SHARDED = sys.argv[3:] in (["zero"], ["zero-first"], ["zero2"], ["zero-gather"], ["zero-commit"])
KILLED_IN = {"zero-gather": "_gather", "zero-commit": "shard_snapshot"}.get(" ".join(sys.argv[3:]))
POWERSGD = sys.argv[3:] == ["powersgd"]
WRAPPED = sys.argv[3:] == ["zero2"] or POWERSGD  # the model in our DistributedDataParallel
WRAPPERS = []  # the live model's wrapper (kept alive; not a submodule: the model's state stays its own)
RESIZED = sys.argv[3:] == ["zero-first"]  # rank 0 killed, then a leave and a growth
KILLED = 0 if RESIZED or KILLED_IN else 2

ctx = hpcreduce.init()
X, Y, dataset = data(SAMPLES)


def make_model(seed: int, sharded: bool = SHARDED):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, CLASSES))
    if (sharded or POWERSGD) and WRAPPED:
        WRAPPERS.append(hpt.DistributedDataParallel(model))
        if POWERSGD:
            hook_state = hpt.hooks.PowerSGDState(start_powerSGD_iter=3)
            WRAPPERS[-1].register_comm_hook(hook_state, hpt.hooks.powerSGD_hook)
            WRAPPERS.append(hook_state)
    optimizer = hpt.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9) \
        if sharded else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=6, gamma=0.5)


model, optimizer, scheduler = make_model(100 + ctx.rank)
hpt.broadcast_parameters(model)  # as docs/torch.md says; a spawned rank skips it (no hang)
sampler = hpt.ElasticSampler(dataset, seed=SEED)
state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler,
                      rng=elastic.RandomStates(), seen=np.zeros((EPOCHS, SAMPLES), dtype=np.int64),
                      discover=discovery)


def kill_at_commit_6() -> None:
    if state.commits == 6 and state.members.me == KILLED and not state.events:
        with open(kill_log, "w", encoding="utf-8") as log:
            log.write(f"{time.time()}\n")
        os.kill(os.getpid(), signal.SIGKILL)


if KILLED_IN:
    killed_method = getattr(optimizer, KILLED_IN)

    def killing_method():
        if KILLED_IN == "shard_snapshot":
            kill_at_commit_6()
        result = killed_method()
        kill_at_commit_6()
        return result

    setattr(optimizer, KILLED_IN, killing_method)


def momentum_buffers():
    """Each parameter's momentum buffer (the whole one, gathered, when sharded; collective then)."""
    if SHARDED:
        full = optimizer.full_state_dict()["state"]
        return [full[index]["momentum_buffer"] for index in sorted(full)] if len(full) == 4 else []
    return [s["momentum_buffer"] for s in optimizer.state.values() if "momentum_buffer" in s]


def newcomer_has_momentum() -> None:
    if ctx.joined and len(state.events) == 1:
        sharded = optimizer.optim.state.values() if SHARDED else optimizer.state.values()
        assert len(sharded) > 0 and all("momentum_buffer" in s for s in sharded)
        print(f"ok newcomer_momentum (rank {ctx.rank})", flush=True)


state.register_reset_callbacks([newcomer_has_momentum])


@elastic.run
def train(state):
    for epoch, x, y, index, counts in batches(dataset, sampler, ctx.size):

        def reduce():
            if not KILLED_IN:
                kill_at_commit_6()  # between backward and the reduction
            if not WRAPPED:  # the wrapper reduced them in backward
                hpt.allreduce_gradients(model, "sum")
            hpcreduce.allreduce(counts, "sum", out=counts)

        step(model, optimizer, scheduler, x, y, reduce, ctx.size if WRAPPED else 1)
        state.seen[epoch] += counts
        sampler.record_batch(len(index))
        if RESIZED and ctx.rank == 0 and state.commits in (9, 12):
            with open(discovery, "w", encoding="utf-8") as wanted:
                wanted.write("2\n" if state.commits == 9 else "3\n")
        state.commit()


train(state)


def everywhere(tensor) -> bool:
    values = tensor.detach().numpy()
    return all(np.array_equal(values, other) for other in ctx.comm.allgather(values))


def check(name: str, ok: bool, detail="") -> None:
    assert ok, f"rank {ctx.rank}: {name}: {detail}"
    print(f"ok {name} (rank {ctx.rank})", flush=True)


params = list(model.parameters())
buffers = momentum_buffers()
check("same_parameters_and_momentum", ctx.size == 3 and all(everywhere(p) for p in params)
      and len(buffers) == 4 and all(everywhere(b) for b in buffers))
check("live_parameters", all(a is b for a, b in zip(optimizer.param_groups[0]["params"], params))
      and (not SHARDED or optimizer.stage == (2 if WRAPPED else 1)))
check("every_sample_once", bool((state.seen == 1).all()), state.seen)
if POWERSGD:
    steps = ctx.comm.allgather(WRAPPERS[1].iter)
    check("hook_state_alike", len(set(steps)) == 1 and steps[0] > 3, steps)
kinds = [(event["kind"], event.get("lost") or event.get("joined") or event.get("left")) for event in state.events]
if not ctx.joined:
    with open(kill_log, encoding="utf-8") as log:
        killed_at = float(log.read())
    failure = state.events[0]
    expected = [("failure", [0]), ("growth", [3]), ("leave", [3]), ("growth", [4])] if RESIZED else \
        [("failure", [KILLED]), ("growth", [3])]
    check("events", kinds == expected and failure["detected_at"] >= killed_at
          and abs(failure["recovered_s"] - (failure["next_step_at"] - failure["detected_at"])) < 1e-3
          and failure["recovered_s"] < 30, state.events)
if ctx.rank == 0 and not POWERSGD:
    reference, ref_optimizer, ref_scheduler = make_model(100, sharded=False)
    one_process_run(reference, ref_optimizer, ref_scheduler, X, Y)
    gaps = relative_gaps(params, reference.parameters()) + relative_gaps(
        buffers, [ref_optimizer.state[r]["momentum_buffer"] for r in reference.parameters()])
    check("equals_one_process_run", max(gaps) < 1e-5 and scheduler.last_epoch == ref_scheduler.last_epoch, gaps)
    print(f"largest relative gap {max(gaps):.2e}; events {state.events}", flush=True)
