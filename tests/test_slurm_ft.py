"""jobs/train_ft.sbatch through the real one-node Slurm: a rank SIGKILLed inside the
allocation is survived in-job (ULFM), and without ULFM the job is relaunched and resumes
from its checkpoint; both jobs end with exit code 0 and write their result."""
import json
from pathlib import Path

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "train_ft.sbatch"
COMMON = {"STEPS": "20", "EXTRA_ARGS": "--batch 1024 --quiet"}


def test_a_killed_rank_is_survived_inside_the_allocation(slurm_cluster, tmp_path):
    out = tmp_path / "ft.json"
    code, output = slurm_cluster.sbatch_wait(SCRIPT, env={**COMMON, "OUT": str(out), "KILLS": "2@8"},
                                             timeout=180)
    assert code == 0, output
    result = json.loads(out.read_text())
    assert [(e["kind"], e["lost"]) for e in result["recovery"]] == [("failure", [2])]
    assert result["ranks"] == 3 and len(result["steps"]) == 20


def test_without_ulfm_the_job_is_relaunched_and_resumes(slurm_cluster, tmp_path):
    out = tmp_path / "fallback.json"
    env = {**COMMON, "OUT": str(out), "KILLS": "1@12", "FALLBACK": "1", "CKPT_EVERY": "5",
           "CKPT_DIR": str(tmp_path / "ckpt"), "RESTARTS": "1"}
    code, output = slurm_cluster.sbatch_wait(SCRIPT, env=env, timeout=180)
    assert code == 0, output
    assert "restart 1 of 1" in output and "resumed from the checkpoint of step 10" in output
    result = json.loads(out.read_text())
    assert result["recovery"][0]["kind"] == "resume" and result["ranks"] == 4
