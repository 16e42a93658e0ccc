"""The mpirun command hpcreduce builds, and the CLI started as a user starts it."""
import json
import os
import subprocess
import sys
import time

import pytest

from hpcreduce.errors import LaunchError
from hpcreduce.runtime.environment import detect_launcher, failure_detection_problem
from hpcreduce.runtime.launch import FT_ARGS, LOOPBACK_ARGS, LaunchPlan, build_mpirun, run_plan
from hpcreduce.runtime.processes import children
from mpi_run import hpcreduce_cli


def plan(n, **kwargs):
    kwargs.setdefault("mpirun", "mpirun")
    return build_mpirun(n, ["python", "train.py"], **kwargs)


def test_root_gets_allow_run_as_root_and_others_do_not():
    assert "--allow-run-as-root" in plan(2, is_root=True, cores=4).argv
    assert "--allow-run-as-root" not in plan(2, is_root=False, cores=4).argv


def test_oversubscribe_and_yield_only_past_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    within = plan(4, cores=4, is_root=False)
    beyond = plan(5, cores=4, is_root=False)
    assert "--oversubscribe" not in within.argv and within.env == {"OMP_NUM_THREADS": "1"}
    assert "--oversubscribe" in beyond.argv
    assert beyond.env == {"OMPI_MCA_mpi_yield_when_idle": "1", "OMP_NUM_THREADS": "1"}
    assert beyond.shell().startswith("OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 mpirun -n 5 --oversubscribe")


def test_an_mpirun_that_cannot_start_leaves_no_process_behind(tmp_path):
    """The output relay's keeper (a child of the launcher) ends with a launch that failed to start."""
    before = children()
    with pytest.raises(OSError):
        run_plan(LaunchPlan([str(tmp_path / "no-mpirun")], {}), echo=False)
    assert children() - before == set()


def test_ranks_share_the_cores_thread_pools_unless_the_user_says(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert plan(2, cores=8, is_root=False).env == {"OMP_NUM_THREADS": "4"}
    assert plan(1, cores=8, is_root=False).env == {}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert plan(2, cores=8, is_root=False).env == {}


def test_ft_adds_ulfm_and_the_tcp_transport_over_loopback_on_one_host(tmp_path, monkeypatch):
    for name in ("SLURM_JOB_NUM_NODES", "PBS_NODEFILE", "HPCREDUCE_SPAWN_INFO", "OMPI_MCA_btl_tcp_if_include"):
        monkeypatch.delenv(name, raising=False)
    argv = plan(3, ft=True, cores=8, is_root=False).argv
    assert argv == ["mpirun", "-n", "3", *FT_ARGS, *LOOPBACK_ARGS, "python", "train.py"]
    assert " ".join(FT_ARGS).startswith("--with-ft ulfm --mca mpi_ft_enable true --mca btl tcp,self")
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2 slots=2\n")
    assert "btl_tcp_if_include" not in plan(3, ft=True, hostfile=str(hosts), is_root=False).argv
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")  # mpirun spreads the ranks over the allocation
    assert "btl_tcp_if_include" not in plan(3, ft=True, cores=8, is_root=False).argv


def test_an_ft_job_on_one_host_talks_over_loopback_only():
    peers = ("import psutil; from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1); "
             "print('peers', sorted({c.raddr.ip for c in psutil.Process().connections('inet') if c.raddr}))")
    result = hpcreduce_cli("launch", "-n", "2", "--ft", "--", "python", "-c", peers, timeout=60)
    lists = [eval(line.split(" ", 1)[1]) for line in result.output.splitlines() if line.startswith("peers ")]
    assert result.returncode == 0 and len(lists) == 2 and all(lists), result
    assert all(ip.startswith("127.") for found in lists for ip in found), result


def test_hostfile_slots_decide_oversubscription(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nnode1 slots=2\nnode2 slots=2\n")
    assert "--oversubscribe" not in plan(4, hostfile=str(hosts), cores=1, is_root=False).argv
    assert "--oversubscribe" in plan(5, hostfile=str(hosts), cores=64, is_root=False).argv
    hosts.write_text("node1\nnode2 slots=2\n")  # a host without slots: Open MPI counts its cores
    assert "--oversubscribe" not in plan(50, hostfile=str(hosts), cores=1, is_root=False).argv


@pytest.mark.parametrize("n, command, message", [(0, ["x"], "at least 1"), (2, [], "no command")])
def test_bad_launch_requests_are_refused(n, command, message):
    with pytest.raises(LaunchError, match=message):
        build_mpirun(n, command, mpirun="mpirun")


def test_launcher_detection_reads_the_environment():
    assert detect_launcher({}) == "none"
    assert detect_launcher({"OMPI_COMM_WORLD_SIZE": "4"}) == "mpirun"
    assert detect_launcher({"PMI_SIZE": "4"}) == "mpirun"
    assert detect_launcher({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}) == "none"  # a batch script
    assert detect_launcher({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
                            "PMIX_RANK": "3"}) == "srun"
    # mpirun in an allocation: its ranks on other nodes inherit srun's variables from their daemon
    assert detect_launcher({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_PROCID": "1",
                            "OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "3"}) == "mpirun"


def test_failure_detection_needs_ulfm_and_no_shared_memory():
    assert "not enabled" in failure_detection_problem({})
    assert "shared memory" in failure_detection_problem({"OMPI_MCA_mpi_ft_enable": "true"})
    assert "shared memory" in failure_detection_problem({"OMPI_MCA_mpi_ft_enable": "1", "OMPI_MCA_btl": "sm,tcp,self"})
    assert failure_detection_problem({"OMPI_MCA_mpi_ft_enable": "true", "OMPI_MCA_btl": "tcp,self"}) is None
    assert failure_detection_problem({"OMPI_MCA_mpi_ft_enable": "true", "OMPI_MCA_btl": "^sm"}) is None
    srun = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "OMPI_MCA_mpi_ft_enable": "true", "OMPI_MCA_btl": "tcp,self"}
    assert "started by srun" in failure_detection_problem(srun)  # ULFM only under Open MPI's own mpirun


def test_launch_dry_run_prints_the_command():
    result = hpcreduce_cli("launch", "-n", "3", "--ft", "--dry-run", "--", "python", "train.py")
    assert result.returncode == 0, result
    line = result.output.strip()
    assert " -n 3 " in line and "--with-ft ulfm" in line and line.endswith("python train.py")


def test_launch_runs_the_ranks_and_passes_their_exit_code_on():
    hello = "from mpi4py import MPI; c = MPI.COMM_WORLD; print('rank', c.rank, 'of', c.size)"
    result = hpcreduce_cli("launch", "-n", "3", "--", "python", "-c", hello, timeout=60)
    assert result.returncode == 0, result
    assert sorted(line for line in result.output.splitlines() if line.startswith("rank")) == \
        [f"rank {r} of 3" for r in range(3)]
    failing = hpcreduce_cli("launch", "-n", "2", "--", "python", "-c", "raise SystemExit(3)", timeout=60)
    assert failing.returncode != 0, failing


def test_nothing_of_the_job_outlives_its_launcher(tmp_path):
    # Under ULFM, Open MPI's mpirun exits as soon as one rank exits 1 and leaves the others running
    # (each rank in a process group of its own): the launcher kills what is left.
    program = ("import os, sys, time; rank = os.environ['OMPI_COMM_WORLD_RANK']; "
               f"folder = {str(tmp_path)!r}; open(os.path.join(folder, 'pid' + rank), 'w').write(str(os.getpid()))\n"
               "while rank == '0' and not os.path.exists(os.path.join(folder, 'pid1')): time.sleep(0.05)\n"
               "sys.exit(1) if rank == '0' else time.sleep(120)")
    started = time.monotonic()
    result = hpcreduce_cli("launch", "-n", "2", "--ft", "--", "python", "-c", program, timeout=60)
    assert result.returncode == 1 and time.monotonic() - started < 30, result
    left = int((tmp_path / "pid1").read_text())
    assert f"1 process(es) of the job outlived mpirun; killed: {left} (python -c" in result.output, result
    with pytest.raises(ProcessLookupError):
        os.kill(left, 0)


def test_info_outside_and_inside_an_ft_launch():
    alone = hpcreduce_cli("info", "--json", timeout=60)
    assert alone.returncode == 0, alone
    facts = json.loads(alone.output)
    assert facts["launcher"] == "none" and facts["ranks"] == 1
    assert facts["ft_enabled"] is False and facts["cuda_aware"] is False
    launched = hpcreduce_cli("launch", "-n", "2", "--ft", "--", "python", "-m", "hpcreduce", "info", "--json",
                             timeout=60)
    assert launched.returncode == 0, launched
    assert launched.output.count('"ft_enabled": true') == 2, launched
    assert launched.output.count('"launcher": "mpirun"') == 2 and '"ranks": 2' in launched.output


def test_fault_tolerance_asked_for_without_ulfm_fails_on_every_rank():
    script = "import hpcreduce; hpcreduce.init(ft=True)"
    result = hpcreduce_cli("launch", "-n", "2", "--", "python", "-c", script, timeout=60)
    assert result.returncode != 0, result
    assert "FaultToleranceUnavailableError" in result.output and "ULFM is not enabled" in result.output


def test_bench_allreduce_writes_every_row(tmp_path):
    path = tmp_path / "bench.json"
    result = hpcreduce_cli("bench", "allreduce", "-n", "2", "--sizes", "4K,256K", "--fusion-arrays", "10",
                           "--json", str(path), timeout=120)
    assert result.returncode == 0, result
    data = json.loads(path.read_text())
    assert data["ranks"] == 2
    assert sorted({(r["bytes"], r["algorithm"]) for r in data["rows"]}) == sorted(
        (b, a) for b in (4096, 262144) for a in ("native", "ring", "rdoubling", "hierarchical", "one_shot", "auto", "auto_nocheck"))
    assert all(r["median_s"] > 0 and r["busbw_GBps"] > 0 for r in data["rows"])
    assert data["fusion"]["speedup"] > 0
    assert "256 KiB" in result.output and "fusion: 10 x 10000 float32" in result.output


def test_launch_runs_the_ranks_in_hpcreduces_own_environment(tmp_path):
    # A PATH whose first ``python`` lacks mpi4py, as on a fresh machine with the venv not activated.
    shim = tmp_path / "python"
    shim.write_text(f"#!/bin/sh\nexec {sys._base_executable} -S \"$@\"\n")  # -S: no site-packages
    shim.chmod(0o755)
    lacking = subprocess.run([str(shim), "-c", "import mpi4py"], capture_output=True, text=True, timeout=60)
    assert lacking.returncode != 0 and "mpi4py" in lacking.stderr, "the shim must lack mpi4py"
    path = os.pathsep.join([str(tmp_path), *(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                             if p != os.path.dirname(sys.executable))])
    which = "import mpi4py, sys; print('rank python', sys.executable)"
    result = hpcreduce_cli("launch", "-n", "2", "--", "python", "-c", which, timeout=60, env={"PATH": path})
    assert result.returncode == 0, result
    assert result.output.count(f"rank python {sys.executable}") == 2, result
    assert f"PATH={os.path.dirname(sys.executable)}:" in result.output and " -x PATH " in result.output, result
