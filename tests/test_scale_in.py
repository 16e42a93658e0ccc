"""Scale-in of a ring job under mpirun --with-ft ulfm: a rank leaves gracefully (``--leave``,
or a discovery file that asks for fewer ranks or hosts), its data shards go to the others,
its process ends at once and the job ends with exit 0, training the same global batches
as a run without a leave (final parameters equal to 1e-5). Bad input: clear errors before
launch, and a discovery file the job cannot use is a printed warning, the job going on.
"""
import json
import os
import threading
import time

import psutil
import pytest
from hypothesis import given, strategies as st

from hpcreduce.ft.faults import FaultConfig
from hpcreduce.ft.resize import GrowthRule, Wanted, discovery_warning, known_hosts, read_discovery
from hpcreduce.runtime.spawn import PER_CPU, SPAWN_INFO, slurm_ranks, spawn_slots
from hpcreduce.runtime.nodes import this_node
from mpi_run import hpcreduce_cli

STEPS = 50
TRAIN = ("train", "--steps", str(STEPS), "--batch", "1024", "--seed", "5")
TIMEOUT = 150


def train(tmp_path, name, *args, ranks=4, ft=True):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "-n", str(ranks), *(["--ft"] if ft else []), *args, "--json", str(out),
                           timeout=TIMEOUT)
    return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result, data = train(tmp_path_factory.mktemp("reference"), "reference", "--quiet", ft=False)
    assert result.returncode == 0, str(result)
    return data["final"]


def assert_same_training(data, reference):
    assert data["final"]["checksum"] == pytest.approx(reference["checksum"], rel=1e-5)
    assert data["final"]["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert [row["step"] for row in data["steps"]] == list(range(1, STEPS + 1))  # none lost or done twice


def leaves(data):
    return [event for event in data["recovery"] if event["kind"] == "leave"]


def assert_shards_dealt_over(event, ids):
    """The event's data shards: every shard read by exactly one of ``ids``, in rank order."""
    assert [owner for owner, _ in event["data_shards"]] == ids
    shards = sorted(shard for _, owned in event["data_shards"] for shard in owned)
    assert shards == list(range(len(shards))) and len(shards) >= len(ids)


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=12), st.integers(1, 14),
       st.dictionaries(st.sampled_from("abcd"), st.integers(1, 4), min_size=1))
def test_the_discovery_file_keeps_at_most_what_it_asks_for_and_never_the_last_rank_away(hosts, number, slots):
    ids = [3 * rank + 1 for rank in range(len(hosts))]  # stable ids need not be contiguous
    rule = GrowthRule(leave=((ids[0], 5),))
    by_number = rule.leavers(4, 5, ids, hosts, number)  # the --leave entry is due, and the number read
    assert by_number == ([] if len(ids) == 1 else [ids[0], *ids[1 + number:]])  # never the last rank
    assert rule.leavers(5, 9, ids, hosts, number) == ids[number:]  # no --leave due: the highest ids beyond it
    by_hosts = rule.leavers(5, 9, ids, hosts, Wanted(sum(slots.values()), slots))
    kept = [host for identity, host in zip(ids, hosts) if identity not in by_hosts]
    assert kept, "the file never takes the last rank"
    if len(kept) > 1 or kept[0] in slots:  # on each host: as many ranks as it has, up to its slots
        assert all(kept.count(host) == min(hosts.count(host), slots.get(host, 0)) for host in set(hosts))
    assert by_hosts == sorted(by_hosts) and set(by_hosts) <= set(ids)


def test_discovery_files_read_as_a_number_hosts_or_a_clear_problem(tmp_path):
    path, node = tmp_path / "discover", this_node()
    assert read_discovery(str(path)) is None  # not there yet: nothing asked
    for text, expected in [("3\n", Wanted(3)), ("", None), (f"# hosts\n{node}:2\nlocalhost.x\nother:3 # c\n",
                                                                Wanted(6, {node: 2, "localhost": 1, "other": 3}))]:
        path.write_text(text)
        assert read_discovery(str(path)) == expected
    for text, why in [("0", "asks for 0 ranks"), ("a:b\n", "line 1: 'a:b' is not HOST[:SLOTS]"),
                      ("a\nb c\n", "line 2: 'b c' is not"), ("a:1\na.x:2\n", "line 2: host a is listed twice"),
                      (f"{node}\nfar:1\n", "line 2: host far is not one the job can run on"),
                      ("²\n", "line 1: '²' is not HOST[:SLOTS]"), ("+-3\n", "line 1: '+-3' is not"),  # int() refuses
                      ("a:²\n", "line 1: 'a:²' is not"), ("3.0\n", "line 1: '3.0' is not"), ("1_000", "'1_000' is not")]:
        path.write_text(text)
        assert why in read_discovery(str(path), known_hosts=[node, "a"])
    path.write_bytes(b"\xff\xfe")
    assert "cannot read it" in read_discovery(str(path))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the job's hostfile\nfar slots=2\n")
    path.write_text(f"{node}:1\nfar:2\n")  # a host of the hostfile the job does not run on yet: growth
    assert read_discovery(str(path), known_hosts([node], str(hostfile))) == Wanted(3, {node: 1, "far": 2})


def test_a_bare_number_is_bounded_by_the_hostfiles_slots_and_a_read_never_raises(tmp_path, monkeypatch):
    path, hostfile = tmp_path / "discover", tmp_path / "hostfile"
    hostfile.write_text("a slots=2\nb slots=3\n")
    path.write_text("1000\n")
    monkeypatch.delenv(SPAWN_INFO.name, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    rule = FaultConfig(discover=str(path), hostfile=str(hostfile)).growth
    assert rule.limit() == (5, "the slots of the job's hosts") and spawn_slots(None) is None
    wanted = rule.wanted(1)
    assert wanted == Wanted(5) and "asks for 1000 ranks, more than the 5 of the slots of the job's hosts" in wanted.bounded
    assert rule.count(0, 1, 2, wanted) == 3 and discovery_warning(wanted) == wanted.bounded
    path.write_text("a:4\nb:9\n")  # hosts whose slots add up past the bound: refused by name, never spawned
    assert "asks for 13 ranks, more than the 5 of the slots of the job's hosts: refused" in rule.wanted(1)
    path.write_text("a:2\nb:3\n")
    assert rule.wanted(1) == Wanted(5, {"a": 2, "b": 3})
    assert FaultConfig(discover=str(path), hostfile=str(hostfile), max_ranks=4).growth.limit() == (4, "--max-ranks")
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # inside a Slurm allocation: its tasks bound it too
    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert rule.limit() == (3, "Slurm's allocation of the job")
    monkeypatch.delenv("SLURM_NTASKS")
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "2(x2),1")
    assert slurm_ranks() == 5
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv(SPAWN_INFO.name, "map_by=slot:oversubscribe")  # oversubscribing, as asked: not the slots
    cpus = os.cpu_count()
    assert FaultConfig(discover=str(path), hostfile=str(hostfile)).growth.limit()[0] == PER_CPU * cpus
    path.write_text(f"localhost:{PER_CPU * cpus + 1}\n")  # HOST:SLOTS is bounded as a bare number is
    assert "refused" in FaultConfig(discover=str(path)).growth.wanted(1)
    broken = GrowthRule(discover=str(tmp_path / "nul\0name")).wanted(1)  # open() raises ValueError: a problem
    assert "cannot read it (embedded null byte)" in broken and "goes on unchanged" in discovery_warning(broken)


class RankWatch(threading.Thread):
    """When each rank process of a job (named by ``marker`` in its command line) was last
    seen, by its launch rank, polled every 20 ms until ``stop``."""

    def __init__(self, marker: str):
        super().__init__(daemon=True)
        self.marker, self.last_seen, self.ranks, self.done = marker, {}, {}, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now = time.time()
            for proc in psutil.process_iter(["pid", "cmdline"]):
                if self.marker not in " ".join(proc.info["cmdline"] or ()):
                    continue
                if proc.pid not in self.ranks:  # mpirun, the launcher, or a rank not yet exec'ed: no rank yet
                    try:
                        rank = proc.environ().get("OMPI_COMM_WORLD_RANK")
                    except psutil.Error:
                        continue
                    if rank is None:
                        continue
                    self.ranks[proc.pid] = int(rank)
                self.last_seen[proc.pid] = now
            time.sleep(0.02)

    def last_seen_by_rank(self):
        self.done.set()
        self.join(5)
        return {rank: self.last_seen[pid] for pid, rank in self.ranks.items()}


def test_a_middle_rank_leaves_its_process_ends_at_once_and_nothing_is_lost(tmp_path, reference):
    watch = RankWatch(str(tmp_path))
    watch.start()
    result, data = train(tmp_path, "left", "--leave", "1@10")
    seen = watch.last_seen_by_rank()
    assert result.returncode == 0, str(result)
    [event] = leaves(data)
    assert event["left"] == [1] and event["lost"] == [] and event["step"] == 10
    assert (event["ranks_before"], event["ranks_after"], data["ranks"]) == (4, 3, 3)
    assert event["requested_at"] <= event["next_step_at"] and event["to_next_step_s"] < 30
    assert_shards_dealt_over(event, [0, 2, 3])
    assert "recovery: leave at step 10: left rank(s) [1], 4 -> 3 ranks" in result.output
    assert_same_training(data, reference)
    assert sorted(seen) == [0, 1, 2, 3], seen
    last_step_at = event["next_step_at"] + data["steps"][-1]["wall_s"] - data["steps"][9]["wall_s"]
    assert seen[1] < last_step_at < min(seen[rank] for rank in (0, 2, 3)), seen  # gone 40 steps before the end


def write_atomically(path, text):
    temporary = f"{path}.new"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def steps_done(metrics):
    try:
        return len(metrics.read_text().splitlines())
    except OSError:
        return 0


def rewrite_as_the_run_goes(discover, metrics, versions):
    """Write each text of ``versions`` into ``discover`` once 3 more steps are done."""
    for text in versions:
        mark = steps_done(metrics)
        while steps_done(metrics) < max(mark, 2) + 3:
            time.sleep(0.02)
        write_atomically(discover, text)


def test_a_discovery_file_asking_for_fewer_ranks_or_hosts_shrinks_the_job_and_a_bad_one_only_warns(tmp_path, reference):
    discover, metrics = tmp_path / "hosts", tmp_path / "metrics.jsonl"
    write_atomically(discover, "3\n")  # fewer than the job starts with: id 3 leaves before step 1
    node = this_node()
    versions = [f"{node}:two\n", "+-3\n", "elsewhere.invalid:2\n", f"# Horovod's format\n{node}:2\n"]
    writer = threading.Thread(target=rewrite_as_the_run_goes, args=(discover, metrics, versions), daemon=True)
    writer.start()
    result, data = train(tmp_path, "discovered", "--discover", str(discover), "--metrics", str(metrics))
    writer.join(5)
    assert result.returncode == 0, str(result)
    first, second = leaves(data)
    assert (first["step"], first["left"], first["ranks_after"]) == (1, [3], 3), data["recovery"]
    assert second["left"] == [2] and (second["ranks_after"], data["ranks"]) == (2, 2), data["recovery"]
    assert_shards_dealt_over(first, [0, 1, 2])
    assert_shards_dealt_over(second, [0, 1])
    for why in (f"line 1: '{node}:two' is not HOST[:SLOTS]", "line 1: '+-3' is not HOST[:SLOTS]",
                "line 1: host elsewhere is not one the job can run on"):
        assert result.output.count(why) == 1, result.output  # printed once, by rank 0, then the job went on
    assert result.output.count("the job goes on unchanged") == 3 and "Traceback" not in result.output
    assert_same_training(data, reference)


BAD = {  # flags -> what the refusal says (each printed once)
    ("--leave", "9@5"): "--leave 9@5: no rank has id 9: the job has ids 0..5",  # 4 ranks, 2 grown
    ("--leave", "1@0"): f"--leave 1@0: STEP must be from 1 to {STEPS} (--steps)",
    ("--leave", "2@3", "--leave", "2@4"): "--leave 2@4: rank 2 leaves twice",
    ("--leave", "two@4"): "--leave 'two@4': expected ID@STEP",
    ("--grow", "2@5"): "--grow/--grow-servers take the job to 6 ranks, past the 5 slots of --hostfile",
}


def test_bad_leaves_and_growth_past_the_slots_are_refused_before_launch(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=5\n")
    flags = [flag for case in BAD for flag in case]
    job = hpcreduce_cli(*TRAIN, "-n", "4", "--ft", "--hostfile", str(hostfile), *flags, timeout=60)
    everyone = hpcreduce_cli(*TRAIN, "-n", "2", "--ft", "--leave", "0@3", "--leave", "1@4", timeout=60)
    for result, messages in ((job, BAD.values()), (everyone, ["--leave: every rank of the job (ids 0..1) leaves"])):
        assert result.returncode == 2 and "Traceback" not in result.output and "mpirun" not in result.output, result
        for message in messages:
            assert result.output.count("hpcreduce train: " + message) == 1, (message, result.output)
