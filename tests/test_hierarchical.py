"""The hierarchical allreduce (collectives/hierarchical.py) on two "nodes" of this host, and
its stepping aside under fault tolerance. The one-node cases run in tests/test_allreduce.py."""
import sys

from hpcreduce.runtime.launch import build_mpirun
from mpi_run import MPI_SCRIPTS, mpirun, run_job
from multinode import nodes


def test_matrix_against_native_on_two_nodes(tmp_path):
    hosts = nodes(tmp_path, [2, 2])
    # the algorithms whose path depends on the nodes (the others' are the one-node matrix's)
    plan = build_mpirun(4, [sys.executable, "-m", "mpi4py", str(MPI_SCRIPTS / "allreduce_matrix.py"),
                            "hierarchical", "auto"], hostfile=hosts.hostfile)
    result = run_job(plan.argv, timeout=300, env={**plan.env, **hosts.env})
    assert result.returncode == 0, result
    assert "N=4 on 2 node(s):" in result.output and " 0 failures" in result.output, result


def test_pieces_on_two_nodes(tmp_path):
    """allreduce_pieces (into out, and in place: on two nodes the hierarchical path writes the
    result back into the pieces; on one node each piece goes native) equals allreduce."""
    hosts = nodes(tmp_path, [1, 1])
    plan = build_mpirun(2, [sys.executable, "-m", "mpi4py", str(MPI_SCRIPTS / "collective_contracts.py"),
                            "check_pieces"], hostfile=hosts.hostfile)
    result = run_job(plan.argv, timeout=120, env={**plan.env, **hosts.env})
    assert result.returncode == 0 and "ok check_pieces" in result.output, result


def test_steps_aside_under_fault_tolerance():
    result = mpirun(2, "hierarchical_ft.py", ft=True, timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("hierarchical stepped aside under fault tolerance") == 2, result
