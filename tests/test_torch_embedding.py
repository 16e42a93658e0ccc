"""hpcreduce.torch's PSEmbeddingBag and start_hybrid under real mpirun: pooled rows and the
servers' row updates equal a local nn.EmbeddingBag's, the dense part stays identical on every
worker, bad input raises on every rank (tests/mpi/torch_embedding.py), and the DLRM-like
example (examples/torch_recsys.py) lowers its held-out loss."""
from pathlib import Path

import pytest

from mpi_run import mpirun

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_recsys.py"


@pytest.mark.parametrize("table, servers", [("fixed", 1), ("dynamic", 2)])
def test_embedding_bag_equals_torch_and_hybrid_keeps_workers_equal(table, servers):
    job = mpirun(servers + 2, "torch_embedding.py", table, str(servers), timeout=60)
    assert job.returncode == 0, job
    assert "PSEmbeddingBag equals nn.EmbeddingBag on 2 workers; dense parameters identical" in job.output, job
    assert "torch embedding: all checks passed" in job.output, job


@pytest.mark.parametrize("tables", [[], ["--fixed"]])
def test_recsys_example_lowers_the_held_out_loss(tables):
    job = mpirun(4, str(EXAMPLE), "--servers", "1", "--steps", "60", "--batch", "128", *tables, timeout=60)
    assert job.returncode == 0, job
    line = next(line for line in job.output.splitlines() if line.startswith("hybrid on 4 ranks"))
    words = line.split()
    before, after = float(words[words.index("->") - 1]), float(words[words.index("->") + 1])
    assert after < before - 0.01, line
