"""A time limit's warning through the real Slurm (issue 37): jobs/train_ring.sbatch is given
``scancel --signal=USR1 --batch`` mid-run; its script passes the signal to the ranks, which
checkpoint into CKPT_DIR and exit 75; the script requeues the job, which starts again over the
folder, resumes and finishes with the same checksum as a job never stopped (submitted alongside).
"""
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "train_ring.sbatch"
COMMON = {"STEPS": "30", "SEED": "1", "LAUNCHER": "srun",
          "EXTRA_ARGS": "--batch 512 --table-rows 4096 --quiet --slow 0:20"}
ONE_NODE = ("--nodes=1", "--ntasks=4")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def signal_when_under_way(cluster, name: str, metrics: Path, sent: list) -> None:
    """``scancel --signal=USR1 --batch`` the job named ``name`` once ``metrics`` has 3 steps; once
    it is requeued, let it start 2 s later, not after Slurm's two-minute hold (the deadline covers a
    slow start of both jobs on a loaded machine). Not at once: slurmd revokes the job's credential
    at the requeue, to the second, and refuses a launch whose credential is of the same second
    ("Job credential revoked"), which ends the job FAILED with exit 1."""
    deadline = time.monotonic() + 360
    while time.monotonic() < deadline and not sent:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            job = cluster.command(["squeue", "-h", "-n", name, "-o", "%i"]).stdout.split()
            if job:
                cluster.command(["scancel", "--signal=USR1", "--batch", job[0]])
                sent.append(job[0])
        time.sleep(0.1)
    while time.monotonic() < deadline and sent:
        state = cluster.command(["squeue", "-h", "-j", sent[0], "-o", "%T %r"], check=False).stdout.split()
        if state[:1] == ["PENDING"] and "BeginTime" in state:
            time.sleep(2)
            cluster.command(["scontrol", "update", f"JobId={sent[0]}", "StartTime=now"], check=False)
            return
        time.sleep(0.2)


def job_log(cluster, job: str) -> str:
    """The daemons' log lines about ``job`` (what Slurm did with it), for a failure message."""
    lines = [line for path in sorted((cluster.run / "log").glob("slurm*.log"))
             for line in path.read_text(errors="replace").splitlines() if job in line]
    return "[slurm logs]\n" + "\n".join(lines[-60:])


def requeued_job_end(cluster, job: str, log: Path, code: int):
    """(exit code, whole output) of requeued job ``job`` once it has left the queue: ``sbatch --wait``
    may return at the requeue itself (with 1) while the requeued run goes on."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        shown = cluster.command(["scontrol", "-o", "show", "job", job], check=False).stdout
        state = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("JobState=")), "")
        if state in ENDED:  # nothing shown (slurmctld busy at the requeue) or under way: look again
            exit_code = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("ExitCode=")), None)
            return (int(exit_code.split(":")[0]) if exit_code else code), \
                f"{log.read_text(errors='replace')}\n[scontrol] {shown}\n{job_log(cluster, job)}"
        time.sleep(0.2)
    raise AssertionError(f"requeued job {job} did not end within 180 s\n{log.read_text(errors='replace')}")


def test_a_signalled_job_requeues_resumes_and_ends_like_one_never_stopped(slurm_cluster, tmp_path):
    name = f"preempt-{uuid.uuid4().hex[:8]}"
    stopped = {**COMMON, "OUT": str(tmp_path / "stopped.json"), "CKPT_DIR": str(tmp_path / "ckpt"),
               "EXTRA_ARGS": f"{COMMON['EXTRA_ARGS']} --metrics {tmp_path / 'steps.jsonl'}"}
    whole = {**COMMON, "OUT": str(tmp_path / "whole.json"), "CKPT_DIR": str(tmp_path / "whole-ckpt")}
    sent: list = []
    threading.Thread(target=signal_when_under_way, args=(slurm_cluster, name, tmp_path / "steps.jsonl", sent),
                     daemon=True).start()
    log = tmp_path / "stopped.out"
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(slurm_cluster.sbatch_wait, SCRIPT, env=env, timeout=240,
                            args=(*ONE_NODE, f"--job-name={job}", *extra))
                for env, job, extra in ((stopped, name, [f"--output={log}"]), (whole, f"{name}-whole", []))]
        (code, output), (whole_code, whole_output) = [run.result() for run in runs]
    assert whole_code == 0, whole_output
    assert sent, output
    code, output = requeued_job_end(slurm_cluster, sent[0], log, code)
    assert code == 0, output
    assert "stopped by SIGUSR1 after step" in output, output
    assert f"requeueing job {sent[0]} (requeued 0 time(s) before)" in output, output
    step = int(output.split("stopped by SIGUSR1 after step ")[1].split(";")[0])
    assert f"resumed from the checkpoint of step {step} (written by 4 ranks, now 4)" in output, output
    result, reference = json.loads(Path(stopped["OUT"]).read_text()), json.loads(Path(whole["OUT"]).read_text())
    assert result["recovery"][0]["kind"] == "resume" and result["recovery"][0]["step"] == step + 1
    assert result["recovery"][0]["requeued"] == 1, result["recovery"]
    assert result["final"] == reference["final"], output
