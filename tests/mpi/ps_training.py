"""PS training: BSP equals ring and single-rank SGD, SSP keeps its bound with a slow
worker, ASP trains, pushes are applied exactly once, a failing worker stops every rank.

Run under mpirun with 4 ranks; every rank asserts.
"""
import dataclasses
import time

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.ps import PSTrainingError
from hpcreduce.train import PS, Ring, TrainConfig, train
from hpcreduce.train.evaluation import evaluate
from hpcreduce.train.models import build
from hpcreduce.train.models.ctr_data import SyntheticCTR
from hpcreduce.train.models.logreg import LogisticRegression
from hpcreduce.train.ps.ps_training import run_ps_training
from shared_checks import Wrapped

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
assert size == 4, "run with 4 ranks"
MLP, DIGITS = build("mlp", 0)
CTR = (LogisticRegression(hash_bits=12),
       SyntheticCTR(0, hash_bits=12, train_examples=50_000, test_examples=2_000))


def close(a, b, tolerance):
    return all(np.allclose(a[k], b[k], rtol=tolerance, atol=tolerance) for k in a)


def check_bsp_equals_ring_and_single_rank():
    """Same seed and global batch: PS (BSP), ring on 4 ranks and one rank reach the same
    parameters; every push is applied exactly once and nothing is stale."""
    for (model, data), servers, optimizer, batch in ((CTR, 1, "adagrad", 256),
                                                    ((MLP, DIGITS), 2, "adam", 64)):
        config = TrainConfig(model=model.name, steps=20, batch=batch, lr=0.05, optimizer=optimizer,
                             topology=PS(servers=servers, consistency="bsp"))
        ps = run_ps_training(ctx, config, model, data)
        ring_config = dataclasses.replace(config, topology=Ring())
        ring = train(model, data, ring_config, comm=ctx, verbose=False)
        single = train(model, data, ring_config, comm=MPI.COMM_SELF, verbose=False)
        assert close(ps.params, single.params, 1e-5), model.name
        assert close(ring.params, single.params, 1e-5), model.name
        assert abs(ps.final.loss - single.final.loss) < 1e-5
        for a, b in zip(ps.steps, single.steps):
            assert abs(a["loss"] - b["loss"]) < 1e-5 and a["examples"] == b["examples"] == batch
        staleness, pushes = ps.staleness, ps.ps["pushes"]
        assert staleness["read_max"] == 0 and len(staleness["lag_hist"]) == 1, staleness
        if model is MLP:  # every worker pushes every dense piece once per step
            pieces = sum(len(p) for p in ps.ps["pieces"].values())
            assert pushes["applied_per_worker"] == [20 * pieces] * 2, pushes
        assert pushes["duplicates_per_worker"] == [0] * (size - servers) == pushes["refused_per_worker"]
        sent = np.array(ps.traffic["bytes_sent"])
        assert sent.shape == (size, 20) and (sent[servers:] > 0).all(), sent


def slowed(step, output):
    time.sleep(0.03)


def check_ssp_bound_holds_with_a_slow_worker():
    """SSP(1): the measured read staleness reaches 1 and never more; ASP with the same slow
    worker does go further, so the bound is what held it."""
    model = Wrapped(MLP, 1, slowed)
    found = {}
    for consistency, staleness in (("ssp", 1), ("asp", 0)):
        config = TrainConfig(steps=12, batch=48, lr=0.1, optimizer="sgd",
                             topology=PS(servers=1, consistency=consistency, staleness=staleness))
        found[consistency] = run_ps_training(ctx, config, model, DIGITS).staleness
    assert found["ssp"]["read_max"] == 1 and found["ssp"]["read_hist"][1] > 0, found
    assert found["asp"]["read_max"] > 1, found
    assert max(len(found["asp"]["lag_hist"]), len(found["ssp"]["lag_hist"])) > 1, found


def check_asp_trains():
    """ASP with fetch/push every 2 steps: the held-out loss falls well below its start."""
    start_loss, _ = evaluate(ctx, MLP, MLP.init_params(0), DIGITS)
    config = TrainConfig(steps=60, batch=64, lr=0.1, optimizer="momentum",
                         topology=PS(servers=2, consistency="asp", fetch_every=2, push_every=2))
    result = run_ps_training(ctx, config, MLP, DIGITS)
    assert result.final.loss < 0.5 * start_loss, (start_loss, result.final)
    pieces = sum(len(p) for p in result.ps["pieces"].values())
    assert result.ps["pushes"]["applied_per_worker"] == [30 * pieces] * 2, result.ps


def poisoned(step, output):
    if step == 3:
        output.grads["b2"][0] = np.nan


def check_a_refused_push_stops_every_rank():
    """A NaN gradient on one worker: refused by its server, and every rank raises
    PSTrainingError naming it once the servers have stopped; the job carries on."""
    config = TrainConfig(steps=8, batch=32, lr=0.1, topology=PS(servers=1, consistency="bsp"))
    try:
        run_ps_training(ctx, config, Wrapped(MLP, 2, poisoned), DIGITS)
    except PSTrainingError as err:
        assert "worker rank 2 at step 3" in str(err) and "NaN or Inf" in str(err), err
    else:
        raise AssertionError(f"rank {rank}: no PSTrainingError")


started = time.perf_counter()
check_bsp_equals_ring_and_single_rank()
check_ssp_bound_holds_with_a_slow_worker()
check_asp_trains()
check_a_refused_push_stops_every_rank()
ctx.comm.Barrier()
if rank == 0:
    print(f"ps training: all checks passed in {time.perf_counter() - started:.1f} s", flush=True)
