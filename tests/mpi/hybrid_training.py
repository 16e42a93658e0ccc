"""Hybrid training through ``train()``: BSP hybrid equals ring and, with a dynamic table
(rows keyed by id on the servers), BSP ps; a worker that fails (its
model raises, or its dense gradient is NaN) stops every rank with ``PSTrainingError``, never
a hang, with the other workers waiting in the dense allreduce.

Run under mpirun with 4 ranks (1 server, 3 workers); every rank asserts.
"""
import dataclasses
import time

import numpy as np

import hpcreduce
from hpcreduce.ps import Dynamic, PSTrainingError, dynamic_table
from hpcreduce.train import PS, Hybrid, Model, Ring, TrainConfig, train
from hpcreduce.train.models.ctr_data import SyntheticCTR
from hpcreduce.train.models.logreg import LogisticRegression
from shared_checks import Wrapped

ctx = hpcreduce.init()
rank, size = ctx.rank, ctx.size
assert size == 4, "run with 4 ranks"
CTR = (LogisticRegression(hash_bits=12),
       SyntheticCTR(0, hash_bits=12, train_examples=50_000, test_examples=2_000))
CONFIG = TrainConfig(model="logreg", steps=12, batch=256, lr=0.05, optimizer="adagrad",
                     topology=Hybrid(servers=1, consistency="bsp"))


def check_bsp_hybrid_equals_ring():
    model, data = CTR
    hybrid = train(model, data, CONFIG, comm=ctx, verbose=False)
    ring = train(model, data, dataclasses.replace(CONFIG, topology=Ring()), comm=ctx, verbose=False)
    assert sorted(hybrid.params) == ["bias", "weights"], sorted(hybrid.params)
    for name in ring.params:
        assert np.allclose(hybrid.params[name], ring.params[name], rtol=1e-5, atol=1e-6), name
    assert abs(hybrid.final.loss - ring.final.loss) < 1e-5
    assert hybrid.ps["hybrid"]["dense_identical"] and hybrid.ps["hybrid"]["dense_steps_applied"] == [12] * 3
    assert hybrid.ps["pieces"] == {}, hybrid.ps["pieces"]  # no dense table on the server


class DynamicLogreg(Model):
    """Logistic regression whose weights are a dynamic table (a row per id seen), bias dense."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def param_specs(self):
        return [dynamic_table("weights", 1, Dynamic(seed=1, init_scale=0.0)), self.inner.param_specs()[1]]

    def init_params(self, seed):  # no init_elements: the dynamic table's start comes from its declaration
        return {"bias": self.inner.init_params(seed)["bias"]}

    def rows(self, batch):
        return self.inner.rows(batch)

    def loss_and_grads(self, params, batch):
        return self.inner.loss_and_grads(params, batch)


def check_bsp_hybrid_equals_ps_with_a_dynamic_table():
    model, data = DynamicLogreg(CTR[0]), CTR[1]
    hybrid = train(model, data, CONFIG, comm=ctx, verbose=False)
    ps = train(model, data, dataclasses.replace(CONFIG, topology=PS(servers=1)), comm=ctx, verbose=False)
    assert abs(hybrid.final.loss - ps.final.loss) < 1e-5 and hybrid.final.accuracy == ps.final.accuracy
    assert abs(hybrid.final.checksum - ps.final.checksum) < 1e-6 * abs(ps.final.checksum)
    assert hybrid.ps["hybrid"]["dense_identical"]


def raises_at_3(call, output):
    if call == 3:
        raise ValueError("the model broke")


def nan_bias_at_2(call, output):
    if call == 2:
        output.grads["bias"][0] = np.nan


def check_a_failing_worker_stops_every_rank(act, on_rank, expected):
    model, data = CTR
    try:
        train(Wrapped(model, on_rank, act), data, CONFIG, comm=ctx, verbose=False)
    except PSTrainingError as err:
        assert all(text in str(err) for text in expected), err
    else:
        raise AssertionError(f"rank {rank}: no PSTrainingError")


started = time.perf_counter()
check_bsp_hybrid_equals_ring()
check_bsp_hybrid_equals_ps_with_a_dynamic_table()
check_a_failing_worker_stops_every_rank(raises_at_3, 2, ["worker rank 2 at step 3: ValueError: the model broke",
                                                         "1 worker(s) failed"])
check_a_failing_worker_stops_every_rank(nan_bias_at_2, 3, ["the mean gradient of the dense parameter 'bias'"])
ctx.comm.Barrier()
if rank == 0:
    print(f"hybrid training: all checks passed in {time.perf_counter() - started:.1f} s", flush=True)
