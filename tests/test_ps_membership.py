"""Parameter-server membership changes without failures: shard servers added to a running
job (``--grow-servers``), ranks leaving gracefully (``--leave``, a discovery file asking for
fewer ranks), and the last server refused leave before launch.

Real ``hpcreduce train --mode ps --ft`` runs. Tolerances: BSP with servers added or leaving
equals the quiet run bit for bit up to summation order (a worker leaving re-splits the
batch: 1e-6 relative); ASP applies pushes in arrival order, so its final loss is held to
10% of the BSP reference, as in ``test_ft_ps``. Exactly once everywhere: for every worker
slot, the pieces the servers applied equal the pieces it had acknowledged, a worker that
left included. A leaver's process is gone while the others still train (watched with psutil).
"""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from hpcreduce.ps import ParamSpec
from hpcreduce.ps.layout import Layout
from hpcreduce.ps.recovery_plan import Committed, Report, make_plan
from hpcreduce.train.ps.resize_requests import kept_going
from mpi_run import hpcreduce_cli

TRAIN = ("train", "--mode", "ps", "--steps", "20", "--batch", "1024", "--seed", "3", "--quiet")
TIMEOUT = 150


def train(tmp_path, name, *args, ranks=5, servers=2, ft=True):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "-n", str(ranks), "--servers", str(servers), *(["--ft"] if ft else []), *args,
                           "--json", str(out), timeout=TIMEOUT)
    assert result.returncode == 0, result.output
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return train(tmp_path_factory.mktemp("quiet"), "quiet", ft=False)["final"]


def assert_exactly_once(data, slots):
    pushes = data["ps"]["pushes"]
    assert [pushes["applied_per_worker"][slot] for slot in slots] == [pushes["made_per_worker"][slot] for slot in slots]
    assert all(pushes["made_per_worker"][slot] > 0 for slot in slots), pushes


def changes(data):
    return [(e["kind"], e["joined"], e["left"]) for e in data["recovery"]]


def assert_timed(data):
    for event in data["recovery"]:
        assert event["requested_at"] is not None and event["next_step_at"] >= event["requested_at"], event


def test_bsp_server_growth_and_leaves_equal_the_quiet_run(tmp_path, reference):
    # ids 0,1 servers, 2-4 workers; id 5 joins as a server at step 8, server 1 leaves at 14, worker 4 at 18
    data = train(tmp_path, "bsp", "--grow-servers", "1@8", "--leave", "1@14", "--leave", "4@18")
    assert changes(data) == [("server-growth", [5], []), ("leave", [], [1]), ("leave", [], [4])]
    growth, server_left, worker_left = data["recovery"]
    assert growth["moved_bytes"] > 0 and server_left["moved_bytes"] > 0 and worker_left["moved_bytes"] == 0
    assert data["ps"]["ids"] == [0, 5, 2, 3]
    assert len(data["ps"]["server_ranks"]) == 2 and data["ps"]["worker_slots"] == [0, 1]
    assert sorted(s for _, shards in worker_left["data_shards"] for s in shards) == list(range(64))
    assert_exactly_once(data, [0, 1, 2])
    assert_timed(data)
    assert data["final"]["checksum"] == pytest.approx(reference["checksum"], rel=1e-6)
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=1e-6)


def test_asp_rank0_server_and_a_worker_leave_after_growth(tmp_path, reference):
    data = train(tmp_path, "asp", "--consistency", "asp", "--grow-servers", "2@6", "--leave", "0@10",
                 "--leave", "3@12")
    assert changes(data) == [("server-growth", [5, 6], []), ("leave", [], [0]), ("leave", [], [3])]
    assert data["ps"]["ids"] == [1, 5, 6, 2, 4]
    assert_exactly_once(data, [0, 1, 2])
    assert_timed(data)
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=0.1)


def rank_processes(marker):
    """The running ranks (children of Open MPI's daemon) whose command line holds ``marker``."""
    found = 0
    for process in psutil.process_iter(["cmdline", "ppid"]):
        try:
            if marker in " ".join(process.info["cmdline"] or ()) and \
                    psutil.Process(process.info["ppid"]).name().startswith("prte"):
                found += 1
        except psutil.Error:
            continue
    return found


def test_ssp_discovery_file_asking_for_fewer_ranks_and_the_leaver_is_gone_at_once(tmp_path):
    wanted = tmp_path / "ranks"
    wanted.write_text("4\n")
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(train, tmp_path, "ssp", "--consistency", "ssp", "--staleness", "1", "--discover", str(wanted),
                          "--steps", "40")
        counts = []  # (wall clock, ranks running)
        while not job.done():
            counts.append((time.time(), rank_processes(str(tmp_path / "ssp.json"))))
            time.sleep(0.05)
        ended = time.time()
        data = job.result()
    assert changes(data) == [("leave", [], [4])]  # the highest id beyond the number
    (leave,) = data["recovery"]
    assert max(count for _, count in counts) == 5, counts
    full = next(at for at, count in counts if count == 5)  # ranks start one by one: 4 before 5 too
    gone = next(at for at, count in counts if count == 4 and at > full)
    # the leaver exited right after the leave, not when the job ended (38 steps later)
    assert gone < (leave["next_step_at"] + ended) / 2 and all(count < 5 for at, count in counts if at >= gone), counts
    assert data["ps"]["ids"] == [0, 1, 2, 3]
    assert_exactly_once(data, [0, 1, 2])
    assert data["final"]["loss"] < 0.6  # from 0.69


@pytest.mark.parametrize("args, named", [
    (("--servers", "1", "--accept-server-loss", "--leave", "0@5"), "--leave"),
    (("--servers", "2", "--leave", "0@5", "--leave", "1@9"), "--leave"),
    (("--servers", "2", "--grow-servers", "1@40"), "--grow-servers"),
    (("--servers", "2", "--grow-servers", "0@4"), "--grow-servers"),
])
def test_impossible_membership_changes_are_refused_before_launch(args, named):
    result = hpcreduce_cli("train", "--mode", "ps", "--ft", "-n", "4", "--steps", "24", *args, timeout=60)
    assert result.returncode == 2, result.output
    assert named in result.output and result.output.count("hpcreduce train:") == 1, result.output


def test_grow_servers_belongs_to_ps_mode():
    result = hpcreduce_cli("train", "--ft", "-n", "4", "--steps", "24", "--grow-servers", "1@5", timeout=60)
    assert result.returncode == 2 and "--grow-servers" in result.output and "ps" in result.output, result.output


def test_the_plan_moves_a_leaving_servers_own_shard_and_retires_a_leaving_worker():
    layout = Layout([ParamSpec("w", (8,)), ParamSpec("emb", (64, 2), sparse=True)], {0: 0, 1: 1, 2: 2}, [3, 4])
    reports = [Report(0, own_key=0, active={0: 5}, replica=(2, 5), leaving=((1, 4), 6)),
               Report(1, own_key=1, active={1: 5}, replica=(0, 5)),
               Report(2, own_key=2, active={2: 5}, replica=(1, 5)),
               Report(3, slot=0, clock=5), Report(4, slot=1, clock=6)]
    plan = make_plan(reports, Committed(layout, 3), bsp=True, now=0.0)
    after = plan.layout(layout)
    assert plan.leaving == [1, 4] and plan.left == ((1, 4), 6) and plan.fatal is None
    assert plan.holders == {0: 0, 1: 1, 2: 2} and plan.adopted == []  # the leaver's own state, not its replica
    assert sorted(after.shard_ranks) == [0, 2] and after.worker_ranks == (3,) and plan.clocks == {0: 5}
    asp = make_plan(reports, Committed(layout, 3), bsp=False, now=0.0)
    assert asp.clocks == {0: 5} and asp.restart is None


def test_a_discovery_file_never_takes_the_last_server_or_the_last_worker():
    roles = [[0, 5], [2, 3, 4]]  # servers' ids, workers' ids
    assert kept_going([5, 3], roles) == ([5, 3], [])
    assert kept_going([0, 5, 3], roles) == ([5, 3], [0])
    assert kept_going([2, 3, 4, 5], roles) == ([3, 4, 5], [2])
    assert kept_going([0, 2, 3, 4, 5], roles) == ([3, 4, 5], [0, 2])
