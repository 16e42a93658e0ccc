"""Model state sharded end to end (run on 4 ranks; every rank asserts, collectively):

- K = 1 and K = 3 servers start from the same model: per-element initial values
  (``counter_normal``) equal the whole model's, whatever the placement;
- a model above ``final.WHOLE_BYTES`` is never assembled: ``params`` is each rank's
  part, while the checksum and held-out metrics equal those of the whole model;
- ``model_dir`` (in argv[1] if given, for the caller to export): the shards and manifest written in parallel assemble (export) to the
  same model, bit for bit, as the whole one gathered;
- ``memory``: every rank's peak RSS (from the OS) and role;
- a table that cannot fit the servers' memory is refused on every rank before anything
  is allocated, naming the sizes, without a hang.
"""
import dataclasses
import os
import sys
import tempfile

import numpy as np

import hpcreduce
from hpcreduce import ps
from hpcreduce.errors import PSConfigError
from hpcreduce.ps.gather import gather_params
from hpcreduce.ps.init import PartInit, counter_normal
from hpcreduce.ps.layout import Layout
from hpcreduce.ps.shard_state import ShardState
from hpcreduce.ps.roles import table_optimizers
from hpcreduce.train import PS, TrainConfig
from hpcreduce.train.models.ctr_data import SyntheticCTR
from hpcreduce.train.models.logreg import LogisticRegression
from hpcreduce.train.ps import final
from hpcreduce.train.ps.export import whole_model
from hpcreduce.train.ps.ps_training import run_ps_training
from hpcreduce.train.results import checksum

ctx = hpcreduce.init()
comm, rank, size = ctx.comm, ctx.rank, ctx.size
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


SPECS = [ps.ParamSpec("emb", (5000, 3), sparse=True), ps.ParamSpec("w", (70000,)), ps.ParamSpec("b", (3,))]


def elements(table, flat):
    return counter_normal(7, SPECS[table].name, flat, 0.1)


def check_same_model_for_any_k():
    whole = {spec.name: elements(t, np.arange(int(np.prod(spec.shape)))).reshape(spec.shape)
             for t, spec in enumerate(SPECS)}
    optimizers = table_optimizers(SPECS, "adagrad", 0.1)
    for servers in (1, 3):
        layout = Layout.initial(SPECS, size, servers)
        state = ShardState.create(layout, layout.shard_of(rank), PartInit(SPECS, elements), optimizers) \
            if layout.is_server(rank) else None
        gathered = gather_params(comm, layout, state)
        check(all(np.array_equal(gathered[n], whole[n]) for n in whole), f"K={servers}: initial model differs")


def check_sharded_end(scratch):
    model = LogisticRegression(hash_bits=12)
    data = SyntheticCTR(0, hash_bits=12, train_examples=20_000, test_examples=1_000)
    config = TrainConfig(steps=6, batch=256, lr=0.1, optimizer="adagrad",
                         topology=PS(servers=2, model_dir=os.path.join(scratch, "model")))
    whole = run_ps_training(ctx, config, model, data)
    final.WHOLE_BYTES = 0  # every model is "large" now: no rank assembles it
    parts = run_ps_training(ctx, dataclasses.replace(config, topology=PS(servers=2)), model, data)
    final.WHOLE_BYTES = 64 << 20
    check(whole.final == parts.final, f"sharded end {parts.final} != whole {whole.final}")
    check(whole.final.checksum == checksum(whole.params), "checksum of the whole params differs")
    rows = parts.params["weights"]
    held = comm.allgather(len(rows.ids))
    check(sum(held) == 4096 and held[2:] == [0, 0], f"rows held by rank: {held}")
    check(np.array_equal(rows.values, whole.params["weights"][np.asarray(rows.ids, np.int64)]), "part != whole")
    exported, about = whole_model(config.topology.model_dir)
    check(about["step"] == 6 and len(about["shards"]) == 2, about)
    check(all(np.array_equal(exported[n], whole.params[n]) for n in exported), "export differs from the model")
    memory = whole.memory
    check(memory["roles"] == ["server", "server", "worker", "worker"], memory)
    check(all(2**20 < peak < 2**33 for peak in memory["peak_rss_bytes"]), memory)
    check(whole.to_json()["memory"] == memory, "memory missing from the JSON")


def check_unfit_table_refused():
    huge = [ps.ParamSpec("emb", (1 << 40, 16), sparse=True)]
    try:
        ps.start(huge, PartInit(huge, lambda t, flat: np.zeros(len(flat), np.float32)), servers=2, comm=ctx)
        failures.append("a 64 TiB table was not refused")
    except PSConfigError as err:
        check("does not fit the servers' memory" in str(err) and "GiB available" in str(err), str(err))


with tempfile.TemporaryDirectory() as folder:
    scratch = sys.argv[1] if len(sys.argv) > 1 else comm.bcast(folder if rank == 0 else None)
    check_same_model_for_any_k()
    check_sharded_end(scratch)
    check_unfit_table_refused()
    comm.Barrier()
for failure in failures:
    print(f"rank {rank}: FAIL {failure}", flush=True)
if comm.allreduce(len(failures)) == 0 and rank == 0:
    print("ps sharded: all checks passed", flush=True)
sys.exit(1 if comm.allreduce(len(failures)) else 0)
