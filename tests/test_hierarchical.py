"""The hierarchical allreduce (collectives/hierarchical.py) on two "nodes" of this host, and
its stepping aside under fault tolerance. The one-node cases run in tests/test_allreduce.py."""
import os
import shutil
import sys

import pytest

from hpcreduce.runtime.launch import build_mpirun
from mpi_run import MPI_SCRIPTS, mpirun, run_job

AGENT = """#!/bin/bash
# mpirun's ssh agent for two "nodes" on this host: the daemon gets its own UTS namespace and hostname.
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
exec unshare --uts bash -c "hostname $host; $*"
"""


def test_matrix_against_native_on_two_nodes(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("two nodes on one host need root and unshare (UTS namespaces)")
    agent, hosts = tmp_path / "agent.sh", tmp_path / "hosts"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    hosts.write_text("node1 slots=2\nnode2 slots=2\n")
    plan = build_mpirun(4, [sys.executable, "-m", "mpi4py", str(MPI_SCRIPTS / "allreduce_matrix.py")],
                        hostfile=str(hosts))
    env = {**plan.env, "PRTE_MCA_plm_ssh_agent": str(agent), "OMPI_MCA_mpi_yield_when_idle": "1"}  # 4 ranks, 2 cores
    result = run_job(plan.argv, timeout=300, env=env)
    assert result.returncode == 0, result
    assert "N=4 on 2 node(s):" in result.output and " 0 failures" in result.output, result


def test_steps_aside_under_fault_tolerance():
    result = mpirun(2, "hierarchical_ft.py", ft=True, timeout=120)
    assert result.returncode == 0, result
    assert result.output.count("hierarchical stepped aside under fault tolerance") == 2, result
