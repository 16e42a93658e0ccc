"""A colocated ``start_hybrid`` loop under ``hpcreduce.elastic`` survives a SIGKILLed rank in place
(``hpcreduce.torch.hybrid_elastic``; tests/mpi/hybrid_elastic.py): both shardings, the rank killed
between steps and with its push posted, the survivors end on the unkilled run's tables and dense
parameters; a dedicated-layout job is refused by ``elastic.State`` on every rank."""
import pytest

from mpi_run import mpirun

pytest.importorskip("torch")


@pytest.mark.parametrize("sharding, where", [("table_wise", "between"), ("table_wise", "in-push"),
                                             ("row_wise", "in-push")])
def test_a_start_hybrid_loop_survives_a_sigkill_and_ends_on_the_unkilled_run(sharding, where):
    result = mpirun(3, "hybrid_elastic.py", sharding, where, ft=True, timeout=120)
    assert result.returncode == 0, result.output
    assert result.output.count(f"hybrid elastic {sharding} {where}: rank") == 2, result.output
