"""Losing a whole node (``--kill-node NODE@STEP``: every rank of one hostname SIGKILLed at once)
on several "nodes" of this host (``multinode``), in both topologies, and the node-aware
replication ring of the parameter server (``ps.layout.node_ring``) that makes a node loss
never take a shard together with its replica.

Ring: 3 nodes x 2 ranks, node2 dies at step 5; the survivors train the same global batches,
so the result equals a quiet run up to summation order (loss 1e-5, checksum 1e-4 relative). PS (BSP, 3 servers;
``hpcreduce train`` deals a PS job's ranks over the nodes round-robin, so node k holds server k-1 and
worker k+2): node2 dies with server 1 and worker 4; no shard has its replica on its own node, shard 1
is adopted from its replica elsewhere (none is restored), every live worker's pushes were applied
exactly once, and the result equals a quiet run up to summation order.
"""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcreduce.ft.inject import KillSchedule, NodeKill, parse_kill_node, unknown_node_problem
from hpcreduce.ps.layout import node_ring
from mpi_run import hpcreduce_cli
from multinode import nodes

TRAIN = ("train", "--steps", "12", "--batch", "1024", "--seed", "3", "--progress", "none")
TIMEOUT = 150


def same_node_pairs(ring, where):
    return sum(where[ring[i]] == where[ring[(i + 1) % len(ring)]] for i in range(len(ring))) if len(ring) > 1 else 0


@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_node_ring_never_pairs_a_node_with_itself_when_a_ring_can_avoid_it(node_of, random):
    keys = sorted(random.sample(range(100), len(node_of)))
    where = {key: f"n{node}" for key, node in zip(keys, node_of)}
    ring = node_ring(keys, where)
    assert sorted(ring) == keys  # every shard has exactly one backup (the next), and backs up exactly one
    largest = max(node_of.count(node) for node in set(node_of))
    if len(set(node_of)) == 1:
        assert ring == keys  # one node: the old rule, sorted keys
    else:  # the fewest a ring allows: none while no node holds more than half the servers
        assert same_node_pairs(ring, where) == max(0, 2 * largest - len(keys)), (ring, where)
    # stable under renumbering: keys renumbered in order and nodes renamed give the same ring
    renumbered = {key: 7 * key + 3 for key in keys}
    renamed = {renumbered[key]: f"other-{node}" for key, node in where.items()}
    assert node_ring([renumbered[key] for key in reversed(keys)], renamed) == [renumbered[key] for key in ring]


def test_kill_node_flag_parses_and_names_unknown_nodes():
    assert parse_kill_node("node2@5") == NodeKill("node2", 5)
    assert parse_kill_node("gpu-a.b@3:recovery") == NodeKill("gpu-a.b", 3, "recovery")
    for bad in ("node2", "@5", "node2@x", "node2@5:never", "node2@-1"):
        with pytest.raises(ValueError, match="expected NODE@STEP"):
            parse_kill_node(bad)
    assert unknown_node_problem([NodeKill("node2", 5)], ["node1", "node2"]) is None
    assert "node(s) node9" in unknown_node_problem([NodeKill("node9", 5)], ["node1", "node2"])
    schedule = KillSchedule(node_kills=[NodeKill("elsewhere", 2)])
    assert not schedule.node_struck("step", 2)  # this host is not "elsewhere": nothing fires here


def test_an_unknown_node_is_refused_before_and_after_launch(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    done = hpcreduce_cli(*TRAIN, "-n", "2", "--ft", "--hostfile", str(hosts), "--kill-node", "node9@3", timeout=60)
    assert done.returncode == 2 and done.output.count("--kill-node: no rank runs on node(s) node9") == 1, done
    done = hpcreduce_cli(*TRAIN, "-n", "2", "--ft", "--kill-node", "node9@3", timeout=TIMEOUT)  # known once running
    assert done.returncode == 2 and done.output.count("--kill-node: no rank runs on node(s) node9") == 1, done


def train(tmp_path, name, *args, ranks, hostfile=None, env=None):
    out = tmp_path / f"{name}.json"
    done = hpcreduce_cli(*TRAIN, "-n", str(ranks), *args, *(["--hostfile", hostfile] if hostfile else []),
                         "--json", str(out), timeout=TIMEOUT, env=env)
    assert done.returncode == 0, done
    return json.loads(out.read_text()), done


def assert_trained_like(data, quiet):
    # summation order only: the checksum (a sum over 2^20 float32 parameters, much of it cancelling) moves
    # by ~1e-5 relative between 6 ranks on 3 nodes and 4 on one even without a failure; the loss by less
    assert data["final"]["checksum"] == pytest.approx(quiet["final"]["checksum"], rel=1e-4)
    assert data["final"]["loss"] == pytest.approx(quiet["final"]["loss"], rel=1e-5)


def test_ring_survives_the_loss_of_a_node(tmp_path):
    three = nodes(tmp_path, [2, 2, 2])
    data, _ = train(tmp_path, "lost", "--ft", "--kill-node", "node2@5", ranks=6, hostfile=three.hostfile,
                    env=three.env)
    assert data["nodes"] == ["node1", "node1", "node3", "node3"]  # the survivors' nodes, at the end
    (event,) = [e for e in data["recovery"] if e["kind"] == "failure"]
    assert sorted(event["lost"]) == [2, 3] and event["ranks_after"] == 4 and event["step"] == 5, event
    assert event["to_next_step_s"] > 0 and event["shrink_s"] >= 0, event  # the timing fields bench recovery reads
    quiet, _ = train(tmp_path, "quiet", ranks=4)
    assert_trained_like(data, quiet)


def test_ps_survives_the_loss_of_a_node_holding_a_server_and_a_worker(tmp_path):
    three = nodes(tmp_path, [2, 2, 2])
    ps = ("--mode", "ps", "--consistency", "bsp")
    data, done = train(tmp_path, "lost", *ps, "--servers", "3", "--ft", "--kill-node", "node2@5", ranks=6,
                       hostfile=three.hostfile, env=three.env)
    homes = {home["shard"]: home for home in data["ps"]["placement"]}
    assert homes[1]["node"] == "node2" and homes[1]["replica_node"] != "node2", homes
    assert [k for k, home in homes.items() if home["node"] == home["replica_node"]] == [], homes
    assert "keep their replica on their own node" not in done.output, done
    events = [e for e in data["recovery"] if e["kind"] == "failure"]
    assert sorted(i for e in events for i in e["lost"]) == [1, 4], events
    assert [k for e in events for k in e["shards_adopted"]] == [1], events
    assert not [k for e in events for k in e["shards_restored"]], events  # no shard lost
    pushes = data["ps"]["pushes"]
    live = data["ps"]["worker_slots"]
    assert sorted(live) == [0, 2], data["ps"]  # slot 1 (rank 4) died with node2
    for slot in live:
        assert pushes["applied_per_worker"][slot] == pushes["made_per_worker"][slot] > 0, pushes
    quiet, _ = train(tmp_path, "quiet", *ps, "--servers", "1", ranks=4)
    assert_trained_like(data, quiet)
