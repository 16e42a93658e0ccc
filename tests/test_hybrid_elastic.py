"""A colocated ``start_hybrid`` loop under ``hpcreduce.elastic`` survives SIGKILLed ranks in place
(``hpcreduce.torch.hybrid_elastic``; tests/mpi/hybrid_elastic.py): both shardings, two ranks killed
in turn between steps, or one with its push posted, in the dense part's backward or at a moment
drawn from a seed (a timer); through ``TrainPipeline`` too (a rank killed right after a step's
``clock()``, before its commit, then one in the dense part's backward; or one as the pipeline takes
the next batch, this one's pull posted): a batch planned before a recovery is dropped and taken
again. The survivors end on the unkilled run's tables and dense parameters. A dedicated-layout
job is refused by ``elastic.State`` on every rank, and so are a pipeline and a pipelined batch bad on
one rank. A rank that leaves at a commit hands its shards over (from their replicas) and the two
that stay end on the run without a leave; a rank spawned into a 2-rank job at a commit (growth)
takes its share of the tables and the 3 end on the run without growth (table-wise; row-wise
through ``TrainPipeline``, which drops the batch it planned over 2 ranks); a rank killed with its push
posted and replaced (``Policy(replace=True)``): the survivors recover the tables, the 3 grow them and
end on the unkilled run."""
import sys
from typing import Optional

import pytest

from mpi_run import MPI_SCRIPTS, hpcreduce_cli, mpirun

pytest.importorskip("torch")


@pytest.mark.parametrize("sharding, where", [pytest.param("table_wise", "between", marks=pytest.mark.extended), ("table_wise", "in-push"),
                                             ("row_wise", "in-backward"), pytest.param("row_wise", "random", marks=pytest.mark.extended),
                                             pytest.param("table_wise", "pipelined-after-clock", marks=pytest.mark.extended),
                                             ("row_wise", "pipelined-pulling")])
def test_a_start_hybrid_loop_survives_a_sigkill_and_ends_on_the_unkilled_run(sharding, where):
    result = mpirun(3, "hybrid_elastic.py", sharding, where, ft=True, timeout=120, env={"HPCREDUCE_TEST_SEED": "1"})
    assert result.returncode == 0, result.output
    survivors = 1 if where in ("between", "pipelined-after-clock") else 2
    assert result.output.count(f"hybrid elastic {sharding} {where}: rank") == survivors, result.output


def launched(tmp_path, ranks: int, sharding: str, how: str, wanted: Optional[int] = None):
    """``hpcreduce launch --ft`` of the driver on ``ranks`` ranks; ``wanted``: the ranks the
    discovery file asks for (a leave or a growth at the first commit), None for no file."""
    discovery = []
    if wanted is not None:
        (tmp_path / "ranks.txt").write_text(f"{wanted}\n")
        discovery = [str(tmp_path / "ranks.txt")]
    result = hpcreduce_cli("launch", "-n", str(ranks), "--ft", "--", sys.executable,
                           str(MPI_SCRIPTS / "hybrid_elastic.py"), sharding, how, *discovery,
                           timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.output
    return result


@pytest.mark.parametrize("sharding, how", [("table_wise", "grow"), ("row_wise", "grow-pipelined")])
def test_a_rank_joins_a_start_hybrid_loop_and_all_end_on_the_run_without_growth(tmp_path, sharding, how):
    result = launched(tmp_path, 2, sharding, how, wanted=3)
    assert result.output.count(f"hybrid elastic {sharding} {how}: rank") == 3, result.output
    assert result.output.count("(spawned) ends on the run without growth") == 1, result.output


@pytest.mark.parametrize("sharding, how", [("table_wise", "leave"), pytest.param("row_wise", "leave", marks=pytest.mark.extended),
                                           ("row_wise", "leave-pipelined")])
def test_a_rank_leaves_a_start_hybrid_loop_and_the_others_end_on_the_run_without_it(tmp_path, sharding, how):
    result = launched(tmp_path, 3, sharding, how, wanted=2)
    assert result.output.count(f"hybrid elastic {sharding} {how}: rank") == 2, result.output


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
def test_a_rank_killed_and_replaced_and_all_end_on_the_unkilled_run(tmp_path, sharding):
    result = launched(tmp_path, 3, sharding, "replace")
    assert result.output.count(f"hybrid elastic {sharding} replace: rank") == 3, result.output
    assert result.output.count("(spawned) ends on the run without the kill") == 1, result.output


def test_ring_neighbours_leaving_together_are_refused_on_every_rank(tmp_path):
    result = launched(tmp_path, 3, "row_wise", "leave-both", wanted=1)
    assert result.output.count("hybrid elastic row_wise leave refused: rank") == 3, result.output
    assert "replica lives on its ring successor, which leaves too" in result.output, result.output
