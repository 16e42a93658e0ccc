"""The test Slurm itself: a job's exit code and output come back, and a job that outlives
its timeout is cancelled and fails the test instead of hanging it; its run folders' base in /tmp
is refused unless private."""
import time

import pytest

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)


def test_sbatch_wait_returns_the_jobs_exit_code_and_output(slurm_cluster, tmp_path):
    script = tmp_path / "exit3.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=2\necho \"tasks=$SLURM_NTASKS greeting=$GREETING\"\n"
                      "srun -n 2 --mpi=none bash -c 'echo task-$SLURM_PROCID'\nexit 3\n")
    code, output = slurm_cluster.sbatch_wait(script, env={"GREETING": "hello"}, timeout=60)
    assert code == 3, output
    assert "tasks=2 greeting=hello" in output, output
    assert sorted(line for line in output.split() if line.startswith("task-")) == ["task-0", "task-1"], output


def test_a_job_past_its_timeout_is_cancelled(slurm_cluster, tmp_path):
    script = tmp_path / "sleeper.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=hpcreduce-sleeper\necho started\nsleep 300\n")
    with pytest.raises(AssertionError, match="did not end within 3 s and was cancelled"):
        slurm_cluster.sbatch_wait(script, timeout=3)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        queue = slurm_cluster.command(["squeue", "-h", "-n", "hpcreduce-sleeper", "-o", "%i %T"]).stdout
        if not queue.strip():
            break
        time.sleep(0.2)
    assert not queue.strip(), f"the job is still queued or running: {queue}"


def test_the_run_folders_base_must_be_this_users_and_written_by_no_one_else(tmp_path):
    from slurm_cluster import runs_base_problem
    base = tmp_path / "hpcreduce-slurm"
    assert runs_base_problem(base) is None and base.is_dir()  # created, private enough
    base.chmod(0o777)  # another user could swap a run folder under root's daemons
    assert "only it may write" in runs_base_problem(base)
    link = tmp_path / "link"
    link.symlink_to(base)
    assert "is not a folder of this user" in runs_base_problem(link)
