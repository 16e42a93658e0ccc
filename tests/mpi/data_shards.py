"""Training on a data directory of shards (run on 3 ranks; argv[1]: a scratch folder).

1. The generated click data written as a directory with the same shards trains bit for bit
   like the generated data itself (same examples, same order, same sums), on 3 ranks.
2. Each rank opened only the training shards it owns (``partition.owned_shards``), and opened
   some; a PS server opens none.
3. One rank alone, and PS under BSP (1 server, 2 workers), train the same global batches as
   the 3-rank ring: parameters within 1e-4 relative (summation order only; see
   train_equivalence.py for the margin).
4. A directory with a missing shard file, or a shard whose dtype or length disagrees with the
   manifest: ``ConfigurationError`` naming the file on every rank, before any step.
Prints "data shards: ok" on rank 0 when every check held, else each failure and exits 1.
"""
import os
import shutil
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.errors import ConfigurationError
from hpcreduce.train import PS, TrainConfig, train
from hpcreduce.train.data_dir import DirDataset, shard_file, write_data_dir
from hpcreduce.train.models import LogisticRegression, SyntheticCTR
from hpcreduce.train.partition import owned_shards

ctx = hpcreduce.init()
world = MPI.COMM_WORLD
folder = sys.argv[1]
good, missing, mismatched = (os.path.join(folder, name) for name in ("good", "missing", "mismatched"))
source = SyntheticCTR(0, train_examples=6000, test_examples=1500)
if world.rank == 0:
    write_data_dir(source, good, train_shards=len(source.shard_sizes("train")), test_shards=3)
    shutil.copytree(good, missing)
    os.remove(os.path.join(missing, shard_file("train", 40, "ids")))
    shutil.copytree(good, mismatched)
    np.save(os.path.join(mismatched, shard_file("test", 1, "label")), np.zeros(7, np.float64))
world.Barrier()
failures = []
config = TrainConfig(steps=8, batch=600, lr=0.2)


def params_difference(a, b):
    scale = max(float(np.abs(b[name]).max()) for name in b) or 1.0
    return max(float(np.abs(a[name] - b[name]).max()) for name in b) / scale


def train_shards_opened(dataset):
    return sorted(shard for split, shard in dataset.opened if split == "train")


# 1. the directory trains exactly like the data it was written from
generated = train(LogisticRegression(), source, config, comm=ctx, verbose=False)
on_dir = DirDataset(good, ("ids", "label"))
ring = train(LogisticRegression(), on_dir, config, comm=ctx, verbose=False)
if (ring.final.checksum, ring.final.loss) != (generated.final.checksum, generated.final.loss):
    failures.append(f"directory vs generated: {ring.final} != {generated.final}")

# 2. only the owned shards were opened
owned = owned_shards(world.rank, world.size, on_dir.shard_sizes("train"))
opened = train_shards_opened(on_dir)
if not opened or not set(opened) <= set(owned):
    failures.append(f"rank {world.rank} opened training shards {opened}, owns {list(owned)}")

# 3. one rank alone, and the parameter server, on the same global batches
if world.rank == 0:
    alone = world.Split(0, 0)
    one = train(LogisticRegression(), DirDataset(good), config, comm=alone, verbose=False)
    if params_difference(one.params, ring.params) > 1e-4:
        failures.append(f"1 rank vs 3 ranks: {params_difference(one.params, ring.params):.2e}")
    alone.Free()
else:
    world.Split(MPI.UNDEFINED, world.rank)
ps_data = DirDataset(good)
ps = train(LogisticRegression(), ps_data, TrainConfig(steps=8, batch=600, lr=0.2, topology=PS(servers=1)),
           comm=ctx, verbose=False)
if params_difference(ps.params, ring.params) > 1e-4:
    failures.append(f"ps vs ring: {params_difference(ps.params, ring.params):.2e}")
ps_owned = set(owned_shards(world.rank - 1, world.size - 1, ps_data.shard_sizes("train"))) if world.rank else set()
ps_opened = train_shards_opened(ps_data)
if not set(ps_opened) <= ps_owned or bool(ps_opened) != bool(ps_owned):
    failures.append(f"ps rank {world.rank} opened training shards {ps_opened}, owns {sorted(ps_owned)}")

# 4. broken directories are refused on every rank, naming the file
for path, named in ((missing, "train-00040.ids.npy is missing"), (mismatched, "test-00001.label.npy holds float64")):
    try:
        train(LogisticRegression(), DirDataset(path), config, comm=ctx, verbose=False)
        failures.append(f"rank {world.rank}: {path} was not refused")
    except ConfigurationError as err:
        if named not in str(err):
            failures.append(f"rank {world.rank}: {path}: {err}")

failures = [text for texts in world.allgather(failures) for text in texts]
if world.rank == 0:
    print("\n".join(failures) or "data shards: ok", flush=True)
sys.exit(1 if failures else 0)
