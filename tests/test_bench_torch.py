"""``hpcreduce bench torch`` runs end to end (a short run: figures are for bench/, not for tests):
every candidate timed, the ratios and the parameters' distance to torch DDP written."""
import json

import pytest

from mpi_run import hpcreduce_cli

pytest.importorskip("torch")


def test_bench_torch_writes_every_candidate_and_the_distance_to_torch_ddp(tmp_path):
    out = tmp_path / "torch.json"
    job = hpcreduce_cli("bench", "torch", "-n", "2", "--models", "mlp", "--warmup", "1", "--iterations", "2",
                        "--json", str(out), timeout=240)
    assert job.returncode == 0, job
    row = json.loads(out.read_text())["rows"][0]
    assert set(row["step_s"]) == {"compute", "torch_ddp", "hpcreduce_ddp", "hpcreduce_ddp_thread",
                                  "hpcreduce_ddp_no_check", "hpcreduce_ddp_bf16", "hpcreduce_ddp_powersgd",
                                  "hpcreduce_ddp_adam", "hpcreduce_zero_adam", "allreduce_gradients",
                                  "allreduce_gradients_no_check", "mpi4py_loop", "mpi4py_flat_loop"}, row
    assert row["max_difference_vs_torch_ddp"] <= 1e-6, row
    sent = row["bytes_sent_per_step"]
    assert abs(sent["hpcreduce_ddp_bf16"] * 2 - sent["hpcreduce_ddp"]) <= 0.01 * sent["hpcreduce_ddp"], row
    assert 0 < sent["hpcreduce_ddp_powersgd"] * 10 < sent["hpcreduce_ddp"], row
    state = row["optimizer_state_bytes"]
    assert 0 < state["hpcreduce_zero_adam"] <= state["hpcreduce_ddp_adam"] / 2 * 1.05, row
    assert "share of the loop's communication hidden" in job.output, job
