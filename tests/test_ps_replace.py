"""``--replace`` under ASP: the replacement of a dead worker takes over its seat (slot, index
among the workers, data shards) and its unfinished work, so no global batch loses the dead
worker's share (``train/ps/worker_side.py``, ``Takeover``).

Worker id 3 (slot 1, index 1 of 3) is SIGKILLed at the start of its step 6. Its replacement
must read exactly the training shards the dead worker read, sit in slot 1 again, and redo the
push window holding the dead worker's last push (step 5, already applied: DUPLICATE, not
counted again) before going on; every step from step 5 on then trains the whole global batch
(the dead worker's log of steps 1-4 died with it), and every slot's applied pieces equal the
pieces it made, the dead slot's including those the servers had from it before the takeover.
"""
import json
from types import SimpleNamespace

from hpcreduce.ps.layout import Layout
from hpcreduce.ps.tables import ParamSpec
from hpcreduce.train.ps.worker_side import Takeover, dead_seats, resume_step, seat_newcomers
from mpi_run import hpcreduce_cli

STEPS, BATCH = 12, 1024


def test_seats_pure():
    before = Layout([ParamSpec("w", (8,))], {0: 0, 1: 1}, [2, 3, 4, 5], [0, 1, 2, 3])
    plan = SimpleNamespace(restart=None, promoted=None, leaving=[], live_workers=[(2, 0), (3, 2)])
    assert dead_seats(before, plan) == [Takeover(1, 1), Takeover(3, 3)]
    assert dead_seats(before, SimpleNamespace(**{**vars(plan), "restart": 4})) == []  # BSP: new slots
    survivors = before.rebuilt({0: 0, 1: 1}, [2, 3], [0, 2], before.slot_count)
    seats = [Takeover(3, 3, 5, 9), Takeover(1, 1, 4, 7)]
    layout, fresh = seat_newcomers(survivors, [4, 5, 6], seats)  # two seats taken back, one newcomer appended
    assert layout.worker_slots == (0, 1, 2, 3, 4) and layout.worker_ranks == (2, 4, 3, 5, 6) and fresh == [4]
    assert [layout.worker_index(rank) for rank in (2, 4, 3, 5)] == [0, 1, 2, 3]  # everybody's share as before
    assert [resume_step(last, every) for last, every in ((-1, 1), (0, 1), (7, 1), (7, 4), (9, 4))] == [0, 0, 7, 4, 8]


def test_a_replacement_takes_over_the_dead_workers_seat_and_its_unfinished_step(tmp_path):
    out = tmp_path / "replace.json"
    done = hpcreduce_cli("train", "-n", "5", "--mode", "ps", "--servers", "2", "--consistency", "asp", "--ft",
                         "--replace", "--kill", "3@6", "--steps", str(STEPS), "--batch", str(BATCH), "--seed", "3",
                         "--progress", "none", "--json", str(out), timeout=180)
    assert done.returncode == 0, done
    data = json.loads(out.read_text())
    failure, replacement = [e for e in data["recovery"] if e["kind"] in ("failure", "replacement")]
    assert failure["lost"] == [3] and replacement["joined"] == [5], data["recovery"]
    before = {worker: shards for worker, shards in failure["data_shards"]}  # the survivors' split, 2 workers
    after = {worker: shards for worker, shards in replacement["data_shards"]}
    assert sorted(after) == [2, 4, 5] and before.keys() == {2, 4}, (before, after)
    assert after[5] == list(range(1, 64, 3)), after  # index 1 of 3: what id 3 read before it died
    assert after[2] == list(range(0, 64, 3)) and after[4] == list(range(2, 64, 3)), after  # unchanged
    assert data["ps"]["worker_slots"] == [0, 1, 2], data["ps"]  # slot 1 taken over, no new slot
    examples = [row["examples"] for row in data["steps"]]
    assert all(count == BATCH for count in examples[4:]), examples  # the redone step and every later one
    pushes = data["ps"]["pushes"]
    for slot in (0, 1, 2):
        assert pushes["applied_per_worker"][slot] == pushes["made_per_worker"][slot] > 0, pushes
    # every slot pushed every step to every shard exactly once: the dead slot's pushes plus the takeover's
    assert len(set(pushes["applied_per_worker"])) == 1, pushes
    assert pushes["duplicates_per_worker"][1] > 0, pushes  # the redone push found the dead worker's pieces
