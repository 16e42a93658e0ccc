"""Sandblaster end to end on 5 ranks (K = 1, 2, 3 servers, a coordinator, the rest workers).

1. Exactly once: with tiny units, backups on and rank 4 slowed so that each of its units
   outlasts three passes (its factor from a pass and a unit's compute measured here and now,
   so backups are certain under the expected-finish rule whatever the machine's speed), the
   gradient the servers
   hold at the committed point equals the single-process full-batch gradient (numpy, same
   batch and l2) to 1e-5; backups happened, and every unit was counted once per pass
   (``units`` = evaluations x units per pass) with every extra result discarded
   (``duplicates_discarded`` = ``backups_issued``: each backup is computed twice, kept once).
2. L-BFGS on logreg reaches scipy's L-BFGS-B optimum of the same objective (f within 1e-4
   relative) for K = 1, 2, 3.
3. A user's Model (README's LinearRegression, float32) trains unchanged to the ridge optimum.
Rank 0 prints a line after each stage (``stage ...``): the test's progress.
"""
import math
import time

import numpy as np

import hpcreduce
from hpcreduce.train import ArrayDataset, Sandblaster, TrainConfig, train
from linear_model import LinearRegression
from hpcreduce.train.models import LogisticRegression, SyntheticCTR
from hpcreduce.train.params import batch_view
from hpcreduce.train.partition import global_batch
from hpcreduce.train.reference import flatten, full_batch_objective, scipy_lbfgs
from hpcreduce.ft.faults import FaultConfig

ctx = hpcreduce.init()
rank = ctx.rank
model = LogisticRegression(hash_bits=10, dtype="float64")
data = SyntheticCTR(0, train_examples=20000, test_examples=2000, fields=8, hash_bits=10)


def check(condition, what):
    if not condition:
        raise AssertionError(f"rank {rank}: {what}")


def batch_indices(config, dataset):
    return global_batch(0, config.batch, dataset.size("train"), config.seed)


def stage(what):
    if rank == 0:
        print(f"stage {what} done", flush=True)


def unit_compute_s(unit):
    """What ``slow_down`` times of one unit's compute here (the least of 20, CPU or wall)."""
    batch = data.batch("train", np.arange(unit))
    view = batch_view(model, model.init_params(0), batch, model.rows(batch))
    times = []
    for _ in range(20):
        wall, cpu = time.perf_counter(), time.process_time()
        model.loss_and_grads(view, batch)
        times.append(min(time.perf_counter() - wall, time.process_time() - cpu))
    return max(min(times), 1e-6)


# 0. a first run warms up what every later one uses (compiled kernels, first-touch memory)
train(model, data, TrainConfig(optimizer="gd", steps=1, batch=256, progress="none", topology=Sandblaster(servers=1)),
      comm=ctx, verbose=False)
stage("warm-up")

# 1. one iteration's gradient, exactly once, with backups and duplicates
for servers in (1, 2):
    plain = TrainConfig(optimizer="gd", steps=1, batch=2048, progress="none", topology=Sandblaster(servers=servers, unit=16))
    pass_s = max(train(model, data, plain, comm=ctx, verbose=False).sandblaster["pass_s"])
    factor = ctx.comm.bcast(max(1000.0, 3 * pass_s / unit_compute_s(16)) if rank == 0 else None, root=0)
    config = TrainConfig(optimizer="gd", steps=1, batch=2048, progress="none",
                         topology=Sandblaster(servers=servers, unit=16), fault=FaultConfig(slow=[(4, factor)]))
    result = train(model, data, config, comm=ctx, verbose=False)
    sb = result.sandblaster
    x = flatten(result.params, model.param_specs())
    _, expected = full_batch_objective(model, data, batch_indices(config, data), config.topology.l2)(x)
    error = float(np.abs(result.gradient - expected).max())
    check(error <= 1e-5 * max(1.0, float(np.abs(expected).max())), f"K={servers}: gradient off by {error}")
    per_pass = math.ceil(config.batch / config.topology.unit)
    check(sb["units"] == sb["evaluations"] * per_pass, f"K={servers}: units {sb['units']} vs "
          f"{sb['evaluations']} passes of {per_pass}")
    check(sum(sb["units_by_worker"].values()) == sb["units"], f"K={servers}: units_by_worker {sb}")
    check(sb["backups_issued"] > 0, f"K={servers}: no backup issued: {sb}")
    check(sb["duplicates_discarded"] == sb["backups_issued"], f"K={servers}: duplicates vs backups: {sb}")
    check(sb["units_by_worker"]["4"] < sb["units_by_worker"][str(servers + 1)],
          f"K={servers}: the slowed worker did not do less: {sb['units_by_worker']}")
    if rank == 0:
        print(f"gradient K={servers}: max error {error:.2e}, {sb['units']} units, {sb['backups_issued']} backups, "
              f"by worker {sb['units_by_worker']} (slowed {factor:.0f}x, a pass {pass_s:.2f} s)", flush=True)
    stage(f"gradient K={servers}")

# 2. L-BFGS reaches scipy's optimum, K = 1, 2, 3
reference = None
for servers in (1, 2, 3):
    config = TrainConfig(optimizer="lbfgs", steps=100, batch=4096, progress="none",
                         topology=Sandblaster(servers=servers))
    result = train(model, data, config, comm=ctx, verbose=False)
    if reference is None:
        x0 = flatten(model.init_params(0), model.param_specs())
        reference = ctx.comm.bcast(scipy_lbfgs(model, data, batch_indices(config, data), config.topology.l2, x0,
                                               tol=1e-9)[1] if rank == 0 else None, root=0)  # once, not per rank
    objective = result.sandblaster["objective"]
    gap = (objective - reference) / abs(reference)
    check(abs(gap) <= 1e-4, f"K={servers}: objective {objective} vs scipy {reference} (relative {gap:.2e})")
    if rank == 0:
        print(f"lbfgs K={servers}: f {objective:.10f} scipy {reference:.10f} relative {gap:.1e}, "
              f"{result.sandblaster['iterations']} iterations, {result.sandblaster['evaluations']} passes, "
              f"stopped by {result.sandblaster['stopped_by']}", flush=True)
    stage(f"lbfgs K={servers}")


# 3. a user's Model, unchanged
rng = np.random.default_rng(1)
features = rng.standard_normal((3000, 16)).astype(np.float32)
targets = (features @ rng.standard_normal(16) + 0.5 + 0.1 * rng.standard_normal(3000)).astype(np.float32)
linear = ArrayDataset("mine", {"x": features[:2000], "y": targets[:2000]},
                      {"x": features[2000:], "y": targets[2000:]})
config = TrainConfig(optimizer="lbfgs", steps=50, batch=1024, progress="none",
                     topology=Sandblaster(servers=2, gtol=1e-5))
result = train(LinearRegression(), linear, config, comm=ctx, verbose=False)
chosen = batch_indices(config, linear)
design = np.hstack([features[chosen], np.ones((len(chosen), 1), np.float32)]).astype(np.float64)
ridge = np.linalg.solve(design.T @ design / len(chosen) + config.topology.l2 * np.eye(17),
                        design.T @ targets[chosen].astype(np.float64) / len(chosen))
found = np.concatenate([result.params["w"], result.params["b"]])
check(result.params["w"].dtype == np.float32, "the user's dtype was not kept")
check(float(np.abs(found - ridge).max()) < 1e-3, f"linear regression {found} vs ridge optimum {ridge}")
if rank == 0:
    print(f"user model: max |w - ridge| {float(np.abs(found - ridge).max()):.1e}, held-out loss "
          f"{result.final.loss:.4f}", flush=True)
    print("sandblaster checks passed", flush=True)
