"""hpcreduce.torch's EmbeddingBagCollection, start_hybrid and TrainPipeline under real mpirun:
pooled rows and the servers' row updates equal local nn.EmbeddingBags', a pipelined BSP run
ends bit for bit where the unpipelined one ends, bad input raises on every rank
(tests/mpi/torch_embedding.py), and the DLRM-like example (examples/torch_recsys.py) lowers
its held-out loss; at the end of uneven shards every trainer stops, an empty batch steps
and a lost server of a dedicated job ends every rank naming it (tests/mpi/torch_pipeline_ends.py)."""
import importlib.util
from pathlib import Path

import pytest

from mpi_run import mpirun

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_recsys.py"


@pytest.mark.parametrize("layout, servers", [("dedicated", 1), ("dedicated", 2), ("colocated", 0)])
def test_collection_equals_torch_and_the_pipeline_equals_plain_steps(layout, servers):
    if layout == "colocated" and importlib.util.find_spec("hpcreduce.ps.colocated") is None:
        pytest.skip("hpcreduce.ps.colocated (ColocatedTables) is not in this tree")
    job = mpirun(servers + 2, "torch_embedding.py", layout, str(servers), timeout=90)
    assert job.returncode == 0, job
    for pooling in ("mean", "sum"):
        assert f"EmbeddingBagCollection equals nn.EmbeddingBag on 2 trainers ({layout}, {pooling})" in job.output, job
    assert "TrainPipeline under BSP ends bit for bit" in job.output, job
    loaded = 1 if layout == "colocated" else servers + 1
    assert f"tables saved by 2 trainers load on {loaded} servers" in job.output, job
    assert "torch embedding: all checks passed" in job.output, job


@pytest.mark.parametrize("tables", [[], ["--fixed"]])
def test_recsys_example_lowers_the_held_out_loss(tables):
    job = mpirun(4, str(EXAMPLE), "--servers", "1", "--steps", "60", "--batch", "128", *tables, timeout=60)
    assert job.returncode == 0, job
    line = next(line for line in job.output.splitlines() if line.startswith("hybrid on 4 ranks"))
    words = line.split()
    before, after = float(words[words.index("->") - 1]), float(words[words.index("->") + 1])
    assert after < before - 0.01, line


def test_a_pipelined_ssp_run_reads_a_step_earlier_and_learns_as_the_unpipelined_one():
    job = mpirun(3, "torch_pipeline_ssp.py", timeout=90)
    assert job.returncode == 0, job
    assert "pipeline ssp: all checks passed" in job.output, job


def test_table_wise_sharding_ends_where_row_wise_ends_and_refuses_bad_input():
    job = mpirun(2, "torch_tablewise.py", timeout=90)
    assert job.returncode == 0, job
    assert "table-wise: all checks passed" in job.output, job


def test_table_wise_sharding_with_replicas_ends_where_row_wise_ends():
    job = mpirun(2, "torch_tablewise.py", "ft", ft=True, timeout=60)
    assert job.returncode == 0, job
    assert "table-wise: all checks passed" in job.output, job


@pytest.mark.parametrize("layout, ranks", [("dedicated", 3), ("row_wise", 2), ("table_wise", 2)])
def test_uneven_shards_stop_every_trainer_and_an_empty_batch_steps(layout, ranks):
    job = mpirun(ranks, "torch_pipeline_ends.py", layout, timeout=150, env={"HPCREDUCE_DEADLINE": "60"})
    assert job.returncode == 0, job
    assert "an empty batch on one trainer: the step goes, pipelined as unpipelined" in job.output, job
    assert f"uneven shards end on every trainer ({layout})" in job.output, job


def test_a_lost_server_of_a_dedicated_hybrid_job_ends_every_rank_naming_it():
    job = mpirun(4, "torch_pipeline_ends.py", "server_lost", ft=True, timeout=150, env={"HPCREDUCE_DEADLINE": "60"})
    assert job.returncode != 0 and "without noticing" not in job.output, job
    for rank in (0, 2, 3):
        assert f"rank {rank} ended: rank {rank}: rank 1 of MPI_COMM_WORLD died during" in job.output, job
