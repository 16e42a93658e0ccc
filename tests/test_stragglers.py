"""Straggler injection (--slow RANK:FACTOR): parsed and refused by name, and in ring and PS runs the
slowed rank computes longer while the result stays the same."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from mpi_run import hpcreduce_cli, run_job

from hpcreduce.ft.faults import FaultConfig, parse_slow
from hpcreduce.runtime.launch import build_mpirun
from hpcreduce.train.straggler import factor_for, slow_down


def test_parse_and_problems_name_the_flag_and_the_straggler():
    assert parse_slow("1:4") == (1, 4.0) and parse_slow("0:1.5") == (0, 1.5)
    for bad in ("1", "1:x", "a:2", "1:2:3"):
        with pytest.raises(ValueError, match="expected RANK:FACTOR"):
            parse_slow(bad)
    assert FaultConfig(slow=[(3, 4.0)]).problems(10, 4) == []
    said = [problem.render() for problem in FaultConfig(
        slow=[(4, 2.0), (1, 0.5), (2, float("inf")), (3, 2.0), (3, 3.0), (-1, 2.0)]).problems(10, 4)]
    assert said == ["slow 4:2: no rank has id 4: the job starts with ranks 0..3",
                    "slow 1:0.5: FACTOR must be >= 1 and finite, got 0.5",
                    "slow 2:inf: FACTOR must be >= 1 and finite, got inf",
                    "slow 3:3: rank 3 is slowed twice",
                    "slow -1:2: no rank has id -1: the job starts with ranks 0..3"]


def test_a_rank_that_computes_no_gradients_is_not_a_straggler():
    from hpcreduce.train.config import PS, Sandblaster, TrainConfig
    said = [problem.render() for problem in TrainConfig(
        optimizer="lbfgs", topology=Sandblaster(servers=2), fault=FaultConfig(slow=[(1, 4.0), (2, 4.0), (3, 4.0)])
    ).problems(6, False)]
    assert said == ["slow 1:4: rank 1 is a server, which computes no gradients; slow a worker (rank 3 or above)",
                    "slow 2:4: rank 2 is the coordinator, which computes no gradients; slow a worker (rank 3 or above)"]
    assert TrainConfig(topology=PS(servers=1), fault=FaultConfig(slow=[(1, 4.0)])).problems(3, False) == []
    assert TrainConfig(fault=FaultConfig(slow=[(0, 4.0)])).problems(3, False) == []


def test_factor_for_and_slow_down_take_factor_times_as_long():
    fault = FaultConfig(slow=[(2, 3.0)])
    assert factor_for(fault, 2) == 3.0 and factor_for(fault, 0) == 1.0
    started, cpu = time.perf_counter(), time.process_time()
    with slow_down(3.0):  # 50 ms of compute
        while time.process_time() - cpu < 0.05:
            pass
    assert time.perf_counter() - started >= 0.15
    started = time.perf_counter()
    with slow_down(1000.0):  # paused, not computing (as a rank descheduled by the others): not stretched
        time.sleep(0.05)
    assert time.perf_counter() - started < 5.0
    with pytest.raises(KeyError), slow_down(50.0):  # an error ends the block without the sleep
        raise KeyError("model")


def compute_events(timeline: Path) -> dict:
    """Each rank's compute phases (the gradient: cat ``compute``) as (duration, injected delay) in
    microseconds: what the straggler injection counted inside each (``args.slowed_us``)."""
    events: dict = {}
    for event in json.loads(timeline.read_text())["traceEvents"]:
        if event.get("ph") == "X" and event["name"] == "compute" and event.get("cat") == "compute":
            events.setdefault(event["pid"], []).append((event["dur"], event["args"].get("slowed_us", 0.0)))
    return events


@pytest.mark.parametrize("mode, slowed, others", [("ring", 1, (0, 2)), ("ps", 2, (1,))])
def test_a_slowed_rank_computes_longer_and_changes_nothing(tmp_path, mode, slowed, others):
    common = ["train", "-n", "3", "--mode", mode, "--steps", "6", "--batch", "2048", "--quiet"]
    plain = hpcreduce_cli(*common, "--json", str(tmp_path / "plain.json"), timeout=120)
    slow = hpcreduce_cli(*common, "--slow", f"{slowed}:4", "--json", str(tmp_path / "slow.json"),
                         "--timeline", str(tmp_path / "slow.trace.json"), timeout=120)
    assert plain.returncode == 0 and slow.returncode == 0, (plain, slow)
    final = [json.loads((tmp_path / name).read_text())["final"] for name in ("plain.json", "slow.json")]
    assert final[0]["checksum"] == final[1]["checksum"] and final[0]["loss"] == final[1]["loss"]
    events = compute_events(tmp_path / "slow.trace.json")
    # not a speed assertion, and no wall-clock compared between ranks (a rank sharing its core with
    # another computes longer without being slowed): the delay injected is counted where it lay.
    # Every compute phase of the slowed rank holds one (its sleep lies inside the phase); the others' none.
    assert events[slowed] and all(0 < injected < duration for duration, injected in events[slowed]), events
    assert all(injected == 0 for rank in others for _, injected in events[rank]), events


def test_a_straggler_that_does_not_exist_is_refused_on_every_rank():
    job = hpcreduce_cli("train", "-n", "3", "--slow", "3:4", "--slow", "1:0", timeout=60)
    assert job.returncode == 2, job
    assert job.output.count("--slow 3:4: no rank has id 3: the job starts with ranks 0..2") == 1, job
    assert job.output.count("--slow 1:0: FACTOR must be >= 1 and finite") == 1, job
    plan = build_mpirun(2, [sys.executable, "-m", "hpcreduce", "train", "--slow", "2:4"])
    job = run_job(plan.argv, timeout=60, env=plan.env)  # under mpirun itself: every rank exits
    assert job.returncode == 2 and job.output.count("--slow 2:4: no rank has id 2") == 1, job
