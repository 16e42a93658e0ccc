"""Dynamic tables through failures and growth, with real SIGKILLs under mpirun --with-ft ulfm:
the built-in embed model (two dynamic tables) trained by parameter servers with replicas.

- BSP without admission or budget: a server's death, arrival or departure changes nothing,
  bit for bit (the replica applied every push in the same order; rows move by id with their
  optimizer state).
- With admission and a budget the survivor holds more shards in one budget, so it evicts
  differently: the run must end trained like the reference, every acknowledged push
  applied once, and the rows' accounting must add up over the servers.
"""
import json

import pytest

from mpi_run import hpcreduce_cli

TRAIN = ("train", "--model", "embed", "--steps", "20", "--batch", "512", "--seed", "3", "--progress", "none")
TIMEOUT = 150


def train(tmp_path, name, *args, ranks=5, ft=True):
    out = tmp_path / f"{name}.json"
    result = hpcreduce_cli(*TRAIN, "-n", str(ranks), *(["--ft"] if ft else []), *args, "--json", str(out),
                           timeout=TIMEOUT)
    assert result.returncode == 0, result
    return json.loads(out.read_text())


def assert_exactly_once(data):
    pushes = data["ps"]["pushes"]
    for slot in data["ps"]["worker_slots"]:
        assert pushes["applied_per_worker"][slot] == pushes["made_per_worker"][slot] > 0, pushes


def assert_rows_add_up(data):
    servers = data["ps"]["dynamic_rows"]
    assert sorted(s["rank"] for s in servers) == data["ps"]["server_ranks"]
    total = {key: sum(s[key] for s in servers) for key in ("rows", "seen", "admitted", "evicted", "dropped")}
    assert total["rows"] == total["admitted"] - total["evicted"] > 0, servers
    assert total["seen"] >= total["admitted"], servers


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return train(tmp_path_factory.mktemp("reference"), "reference", "--mode", "ps", "--servers", "2", ft=False)


@pytest.mark.parametrize("name, ranks, args", [
    ("server-killed", 5, ("--servers", "2", "--kill", "1@8")),
    ("server-grown", 5, ("--servers", "2", "--grow-servers", "1@8")),
    pytest.param("server-left", 6, ("--servers", "3", "--leave", "1@8"), marks=pytest.mark.extended),
])
def test_bsp_rows_survive_a_server_dying_joining_or_leaving_bit_for_bit(tmp_path, reference, name, ranks, args):
    data = train(tmp_path, name, "--mode", "ps", *args, ranks=ranks)
    assert data["final"]["checksum"] == reference["final"]["checksum"], (data["final"], reference["final"])
    assert data["recovery"], "the failure or growth happened"
    assert_exactly_once(data)
    assert_rows_add_up(data)


@pytest.fixture(scope="module")
def trained_reference(tmp_path_factory):
    """The reference trained long enough (40 steps) that an SSP run's order of updates, which
    changes with the timing of a kill, no longer moves its accuracy by more than 0.01 (at 20
    steps, 2 runs in 26 ended 0.03-0.05 below the rest)."""
    return train(tmp_path_factory.mktemp("trained"), "reference", "--mode", "ps", "--servers", "2",
                 "--steps", "40", ft=False)


@pytest.mark.parametrize("mode, killed", [("ps", "1@8"), ("hybrid", "3@8")])
def test_admission_and_eviction_through_a_kill_train_like_the_reference(tmp_path, trained_reference, mode, killed):
    reference = trained_reference
    data = train(tmp_path, f"{mode}-budget", "--mode", mode, "--servers", "2", "--consistency", "ssp",
                 "--staleness", "1", "--admit-after", "2", "--row-budget", "40K", "--kill", killed, "--steps", "40")
    assert [e for e in data["recovery"] if e["kind"] == "failure"], data["recovery"]
    assert_exactly_once(data)
    assert_rows_add_up(data)
    rows = data["ps"]["dynamic_rows"]
    assert sum(s["dropped"] for s in rows) > 0 and sum(s["evicted"] for s in rows) > 0  # admission, eviction
    assert data["final"]["accuracy"] == pytest.approx(reference["final"]["accuracy"], abs=0.02)


def test_model_dir_and_export_write_a_dynamic_table_as_its_ids_and_rows(tmp_path):
    import numpy as np
    data = train(tmp_path, "model-dir", "--mode", "hybrid", "--servers", "2", "--steps", "6",
                 "--model-dir", str(tmp_path / "model"), ranks=4, ft=False)
    out = tmp_path / "model.npz"
    exported = hpcreduce_cli("export", str(tmp_path / "model"), "--out", str(out), timeout=60)
    assert exported.returncode == 0, exported
    model = np.load(out)
    held = sum(s["rows"] for s in data["ps"]["dynamic_rows"])
    for table, width in (("embeddings", 8), ("linear", 1)):
        ids = model[f"{table}.ids"]
        assert model[table].shape == (len(ids), width) and (np.diff(ids) > 0).all()
    assert len(model["embeddings.ids"]) + len(model["linear.ids"]) == held > 0
