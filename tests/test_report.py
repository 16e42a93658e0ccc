"""``hpcreduce report``: PNGs of a real training result (parameter server, SSP, so the
staleness histograms have something in them; its --metrics and --timeline are checked
too) and of a real allreduce benchmark."""
import json

from mpi_run import hpcreduce_cli

PNG = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5_000, (path, len(data))


def test_ps_run_metrics_timeline_and_figures_of_it_and_of_a_benchmark(tmp_path):
    run, metrics, trace = tmp_path / "ps.json", tmp_path / "ps.jsonl", tmp_path / "ps-trace.json"
    job = hpcreduce_cli("train", "-n", "3", "--mode", "ps", "--consistency", "ssp", "--staleness", "1",
                        "--steps", "8", "--quiet", "--json", str(run), "--metrics", str(metrics),
                        "--timeline", str(trace), timeout=180)
    assert job.returncode == 0, job
    assert json.loads(run.read_text())["staleness"]["read_hist"], job
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]  # the global batch's, the server's
    assert [row["step"] for row in rows] == list(range(1, 9)), rows
    assert all(0 <= row["read_staleness"] <= 1 and row["examples"] == 4096 for row in rows), rows
    assert [row["loss"] for row in rows] == [row["loss"] for row in json.loads(run.read_text())["steps"]], rows
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    for worker in (1, 2):  # rank 0 serves: no phases of its own
        calls = sorted((e["name"], e["cat"]) for e in events if e["pid"] == worker and e["args"]["step"] == 8)
        assert calls == [("communication", "push"), ("communication", "read"), ("compute", "compute")], events
    assert not [e for e in events if e["pid"] == 0]
    job = hpcreduce_cli("report", str(run), timeout=120)
    assert job.returncode == 0, job
    for name in ("loss.png", "throughput.png", "staleness.png"):
        assert_png(tmp_path / "ps-report" / name)
        assert f"wrote {tmp_path / 'ps-report' / name}" in job.output, job

    bench = tmp_path / "allreduce.json"
    job = hpcreduce_cli("bench", "allreduce", "-n", "2", "--sizes", "4K,64K", "--fusion-arrays", "2",
                        "--fusion-elements", "100", "--json", str(bench), timeout=180)
    assert job.returncode == 0, job
    job = hpcreduce_cli("report", str(bench), "--out", str(tmp_path / "figures"), timeout=120)
    assert job.returncode == 0, job
    assert_png(tmp_path / "figures" / "allreduce_busbw.png")


def test_report_refuses_what_it_cannot_draw(tmp_path):
    lines = tmp_path / "metrics.jsonl"
    lines.write_text('{"step": 1}\n{"step": 2}\n')
    job = hpcreduce_cli("report", str(lines), timeout=60)
    assert job.returncode == 1 and f"cannot read {lines}" in job.output, job
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    job = hpcreduce_cli("report", str(other), timeout=60)
    assert job.returncode == 1 and "not a result of hpcreduce train --json" in job.output, job
    assert not (tmp_path / "other-report").exists()
