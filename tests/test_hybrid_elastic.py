"""A colocated ``start_hybrid`` loop under ``hpcreduce.elastic`` survives SIGKILLed ranks in place
(``hpcreduce.torch.hybrid_elastic``; tests/mpi/hybrid_elastic.py): both shardings, two ranks killed
in turn between steps, or one with its push posted, in the dense part's backward or at a moment
drawn from a seed (a timer); through ``TrainPipeline`` too (a rank killed right after a step's
``clock()``, before its commit, then one in the dense part's backward; or one as the pipeline takes
the next batch, this one's pull posted): a batch planned before a recovery is dropped and taken
again. The survivors end on the unkilled run's tables and dense parameters. A dedicated-layout
job is refused by ``elastic.State`` on every rank, and so are a pipeline, a pipelined batch bad on
one rank, a rank spawned into the job and a leave (not supported)."""
import sys

import pytest

from mpi_run import MPI_SCRIPTS, hpcreduce_cli, mpirun

pytest.importorskip("torch")


@pytest.mark.parametrize("sharding, where", [("table_wise", "between"), ("table_wise", "in-push"),
                                             ("row_wise", "in-backward"), ("row_wise", "random"),
                                             ("table_wise", "pipelined-after-clock"),
                                             ("row_wise", "pipelined-pulling")])
def test_a_start_hybrid_loop_survives_a_sigkill_and_ends_on_the_unkilled_run(sharding, where):
    result = mpirun(3, "hybrid_elastic.py", sharding, where, ft=True, timeout=120, env={"HPCREDUCE_TEST_SEED": "1"})
    assert result.returncode == 0, result.output
    survivors = 1 if where in ("between", "pipelined-after-clock") else 2
    assert result.output.count(f"hybrid elastic {sharding} {where}: rank") == survivors, result.output


@pytest.mark.parametrize("ranks, said", [(4, "take no new rank"), (2, "no rank may leave")])
def test_growth_and_leaves_of_a_start_hybrid_loop_are_refused_on_every_rank(tmp_path, ranks, said):
    discovery = tmp_path / "ranks.txt"
    discovery.write_text(f"{ranks}\n")
    result = hpcreduce_cli("launch", "-n", "3", "--ft", "--", sys.executable, str(MPI_SCRIPTS / "hybrid_elastic.py"),
                           "resize", str(discovery), timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.output
    assert result.output.count("hybrid elastic resize refused: rank") == max(ranks, 3), result.output
    assert said in result.output, result.output
