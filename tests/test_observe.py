"""Observability of ``hpcreduce train``: --metrics (JSON lines), --timeline (Chrome trace),
--quiet, and the progress bar on a terminal (a real pseudo-terminal around the command)."""
import json
import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest

from mpi_run import hpcreduce_cli

from hpcreduce.runtime.jobs import stop_job
from hpcreduce.train import timeline

RANKS, STEPS = 2, 6


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("observe")
    job = hpcreduce_cli("train", "-n", str(RANKS), "--steps", str(STEPS), "--quiet",
                        "--metrics", str(folder / "m" / "metrics.jsonl"), "--timeline", str(folder / "trace.json"),
                        "--json", str(folder / "result.json"), timeout=180)
    return job, folder


def test_quiet_prints_no_progress_and_metrics_have_one_line_per_step(observed):
    job, folder = observed
    assert job.returncode == 0, job
    assert not [line for line in job.output.splitlines() if line.startswith("step ")], job
    assert job.output.count("final: loss") == 1, job
    lines = (folder / "m" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), lines
    result = json.loads((folder / "result.json").read_text())
    for row, logged, sent in zip(rows, result["steps"], result["traffic"]["bytes_sent"][0]):
        assert row["loss"] == logged["loss"] and row["accuracy"] == logged["accuracy"], (row, logged)
        assert row["bytes_sent"] == sent and row["bytes_received"] >= 4 << 20, row  # the densified table
        assert row["samples_per_s"] > 0 and row["step_s"] > 0 and row["examples"] == 4096, row


def test_timeline_is_a_chrome_trace_with_every_phase_of_every_step_on_every_rank(observed):
    job, folder = observed
    assert job.returncode == 0, job
    trace = json.loads((folder / "trace.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(RANKS)}, names
    for event in events:
        assert event["name"] in timeline.PHASES and event["dur"] >= 0 and event["ts"] >= 0, event
        assert event["pid"] in range(RANKS) and event["tid"] == 0, event
    waited = 0
    for step in range(1, STEPS + 1):
        for rank in range(RANKS):
            mine = [e for e in events if e["pid"] == rank and e["args"]["step"] == step]
            calls = [(e["name"], e["cat"]) for e in mine]
            assert calls.count(("compute", "compute")) == 1 and calls.count(("compute", "apply")) == 1, mine
            assert calls.count(("communication", "reduce")) == 1, mine
            waits = [e for e in mine if e["name"] == "wait"]
            if waits:  # the wait ends where the allreduce's communication starts
                talk = next(e for e in mine if e["name"] == "communication")
                assert abs(waits[0]["ts"] + waits[0]["dur"] - talk["ts"]) < 0.01, mine
            waited += len(waits)
        ranks_waiting = {e["pid"] for e in events if e["name"] == "wait" and e["args"]["step"] == step}
        assert len(ranks_waiting) < RANKS, (step, ranks_waiting)  # the last rank in never waits
    assert waited >= 1, events


def test_wait_is_cut_from_the_collective_until_the_last_rank_entered():
    rank0 = np.array([[0.0, 1.0, 0, 0, 1, 0, 0], [1.0, 3.0, 1, 1, 1, 0, 0], [0.5, 0.9, 1, 1, 1, 1, 0]])
    rank1 = np.array([[0.0, 2.0, 0, 0, 1, 0, 0], [2.0, 3.0, 1, 1, 1, 0, 0]])
    first, second = timeline.split_waits([rank0, rank1], collective={1})
    wait = first[first[:, timeline.PHASE] == timeline.PHASES.index("wait")]
    assert wait.tolist() == [[1.0, 2.0, 2, 1, 1, 0, 0]]  # rank 0 waited for rank 1 from 1 s to 2 s
    assert first[1].tolist() == [2.0, 3.0, 1, 1, 1, 0, 0] and first[2].tolist() == rank0[2].tolist()  # failed: kept
    assert second.tolist() == rank1.tolist()


def test_ranks_timing_different_calls_share_one_naming():
    server = np.zeros((0, timeline.COLUMNS))
    worker = np.array([[0.0, 1.0, 1, 0, 1, 0, 0], [1.0, 2.0, 0, 1, 1, 0, 0]])
    ring = np.array([[0.0, 1.0, 1, 0, 1, 0, 0]])
    per_rank, calls, collective = timeline.one_naming(
        [(server, [], []), (worker, ["read", "compute"], []), (ring, ["reduce"], ["reduce"])])
    assert calls == ["read", "compute", "reduce"] and collective == {2}
    assert per_rank[1][:, timeline.CALL].tolist() == [0, 1] and per_rank[2][:, timeline.CALL].tolist() == [2]
    assert len(per_rank[0]) == 0


def test_timed_calls_record_failures_and_belong_to_the_next_committed_step():
    class Work:
        def ok(self):
            return 5

        def broken(self):
            raise RuntimeError("no")

    line = timeline.Timeline()
    work = line.timed(Work(), {"ok": "compute", "broken": "communication"})
    assert work.ok() == 5
    with pytest.raises(RuntimeError):
        work.broken()
    line.step_done(7)
    work.ok()
    line.step_done(8)
    assert [(row[timeline.STEP], row[timeline.FAILED]) for row in line.rows] == [(7, 0), (7, 1), (8, 0)]
    with pytest.raises(ValueError, match="phases must be among"):
        line.timed(Work(), {"ok": "thinking"})


def run_in_terminal(argv, timeout: float) -> str:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr; return what it wrote."""
    master, slave = os.openpty()
    child = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    output, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal closed: every writer is gone
                    break
                if not chunk:
                    break
                output += chunk
            elif child.poll() is not None:
                break
        else:
            stop_job(child, grace=0)
            raise AssertionError(f"timed out after {timeout} s: {argv}\n{output.decode(errors='replace')}")
        assert child.wait(timeout=30) == 0, output.decode(errors="replace")
    finally:
        os.close(master)
    return output.decode(errors="replace")


def test_progress_bar_on_a_terminal():
    text = run_in_terminal([sys.executable, "-m", "hpcreduce", "train", "-n", "1", "--model", "mlp",
                            "--steps", "40"], timeout=120)
    bars = [part for part in text.split("\r") if part.startswith("step ")]
    assert bars and bars[-1].startswith("step 40/40 [" + "#" * 24 + "] 100%"), text
    assert "samples/s  ETA " in bars[-1] and "loss " in bars[-1], text
    assert "(train, last" not in text, text  # no plain progress lines on a terminal
    assert text.count("final: loss") == 1, text
