"""jobs/bench_scaling.sbatch through the real two-node Slurm, 2 tasks per node: the batch
script runs ``hpcreduce bench scaling``, which starts every run as its own ``srun`` job step
spread over both nodes (the 2-rank runs cross them), and fits the two links (within a node,
between nodes) from the ping-pongs of its 4-rank fit run: each run beside its two-link
forecast, and the flat ring, the hierarchical allreduce and the PS forecast for 8-1024 nodes."""
import json
from pathlib import Path

from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "bench_scaling.sbatch"


def test_bench_scaling_job_across_two_nodes_fits_both_links(slurm_cluster, tmp_path):
    out = tmp_path / "scaling"
    env = {"LAUNCHER": "srun", "RANKS": "2", "OUT": str(out), "STEPS": "4", "SIZES": "4K,64K,1M",
           "EXTRA_ARGS": "--warmup 1 --predict 8,64 --fit-ranks 4"}
    code, output = slurm_cluster.sbatch_wait(SCRIPT, env=env, args=("--nodes=2", "--ntasks=4", "--ntasks-per-node=2"),
                                             timeout=300)
    assert code == 0, output
    assert "+ hpcreduce bench scaling -n 2 --launcher srun --launcher-args=--mpi=pmix" in output, output
    result = json.loads((out / "scaling.json").read_text())
    rows = result["rows"]
    assert [(row["topology"], row["ranks"], row["nodes"]) for row in rows] == \
        [("ring", 1, 1), ("ring", 2, 2), ("ps", 2, 2)], rows
    assert json.loads((out / "runs" / "ps-2.json").read_text())["nodes"] == ["node1", "node2"]
    assert result["launcher"] == "srun" and [p["ranks"] for p in result["predictions"]] == [8, 64]
    for log, ranks in (("ring-2.log", 2), ("ps-2.log", 2), ("allreduce.log", 4)):
        assert (out / "runs" / log).read_text().startswith(f"$ srun -N 2 -n {ranks} --mpi=pmix "), log
    links = result["links"]
    assert links["nodes"] == ["node1", "node1", "node2", "node2"] and links["ranks_per_node"] == 2, links
    for name in ("within", "between"):
        fit = links[name]
        assert fit is not None and fit["points"] == 3, links
        assert fit["alpha_s"] >= 0 and fit["beta_s_per_byte"] >= 0 and fit["alpha_s"] + fit["beta_s_per_byte"] > 0, fit
        assert len(links[f"{name}_s"]) == 3 and all(t > 0 for t in links[f"{name}_s"]), links
    assert all(row["two_link_step_s"] > 0 for row in rows), rows
    forecast = result["node_predictions"]
    assert [(p["nodes"], p["ranks"]) for p in forecast] == [(m, 2 * m) for m in (8, 16, 32, 64, 128, 256, 512, 1024)]
    for p in forecast:
        assert min(p["ring_step_s"], p["hierarchical_step_s"], p["ps_step_s"]) > 0, p
        assert p["fastest"] in ("ring", "hierarchical", "ps") and 1 <= p["ps_servers"] < p["ranks"], p
    for figure in ("scaling.png", "nodes.png"):
        assert (out / figure).stat().st_size > 10_000, figure
    assert "forecast by nodes (2 ranks per node)" in output and "Recommendation" in output, output
