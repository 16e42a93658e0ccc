"""``hpcreduce bench embeddings`` runs each part end to end at tiny sizes (figures are for
bench/embeddings.sh, not for tests): the JSON has every field, with values that add up."""
import importlib.util
import json

import pytest

from mpi_run import hpcreduce_cli

TIMEOUT = 90


def bench(tmp_path, *flags: str) -> dict:
    out = tmp_path / "embeddings.json"
    job = hpcreduce_cli("bench", "embeddings", *flags, "--json", str(out), timeout=TIMEOUT)
    assert job.returncode == 0, job
    return json.loads(out.read_text())


def test_rows_times_the_sparse_pull_push_against_raw_transfers_of_its_bytes(tmp_path):
    row = bench(tmp_path, "-n", "3", "--servers", "2", "--parts", "rows", "--rows", "256", "--width", "8",
                "--table-rows", "4K", "--rounds", "2", "--reps", "3")["rows"]
    assert (row["servers"], row["workers"], row["rows"], row["width"]) == (2, 1, 256, 8), row
    assert row["ps_rows_per_s"] > 0 and row["raw_rows_per_s"] > 0, row
    assert row["ratio"] == pytest.approx(row["raw_s"] / row["ps_s"]), row


def test_scale_streams_distinct_ids_through_replicated_budgeted_servers(tmp_path):
    ids, points = 1 << 16, 3
    result = bench(tmp_path, "-n", "4", "--servers", "2", "--replicas", "--parts", "scale", "--ids", "64K",
                   "--push-rows", "4K", "--budget", "256K", "--rss-points", str(points))["scale"]
    assert (result["servers"], result["workers"], result["shards_per_server"]) == (2, 2, 2), result
    servers = result["server"]
    assert sorted(server["shard"] for server in servers) == [0, 1], servers
    for server in servers:
        rows = server["dynamic_rows"]
        assert rows["rows"] + rows["evicted"] == rows["admitted"] > 0, server  # every row made is held or gone
        assert rows["admitted"] + rows["dropped"] == rows["seen"], server  # a push past the budget drops some
        assert rows["evicted"] > 0, server  # 256 KiB holds far fewer than the shard's 32K ids
        assert server["peak_rss_bytes"] >= server["base_rss_bytes"] > 0, server
    assert sum(server["dynamic_rows"]["seen"] for server in servers) == ids, servers  # each distinct id once
    assert sum(worker["ids"] for worker in result["worker"]) == ids, result["worker"]
    for worker in result["worker"]:
        assert len(worker["rss"]) == points + 1 and min(p["rss_bytes"] for p in worker["rss"]) > 0, worker
    assert result["ids_per_s"] > 0 and result["load_max_over_mean"] >= 1.0, result


def test_peers_time_torch_ddp_and_account_for_every_candidate(tmp_path):
    pytest.importorskip("torch")
    peers = ("torch_ddp", "torchrec", "hpcreduce", "hpcreduce_colocated", "hpcreduce_tablewise")
    result = bench(tmp_path, "-n", "3", "--servers", "1", "--parts", "peers", "--fields", "3", "--field-rows", "1000",
                   "--batch", "32", "--warmup", "1", "--iterations", "2", "--peers", ",".join(peers))["peers"]
    ran, left_out = result["candidates"], result["left_out"]
    assert "torch_ddp" in ran, result
    assert all((name in ran) != (name in left_out) for name in peers), result
    for name, row in ran.items():
        assert row["examples_per_s"] > 0 and row["bytes_per_step"] > 0, (name, row)
        assert 0.0 < row["loss"] < 1.0, (name, row)  # log-loss of a learnable batch after a few SGD steps
        assert len(row["added_rss_bytes"]) == 3, (name, row)
    assert ran["torch_ddp"]["trainers"] == 3 and ran["hpcreduce"]["trainers"] == 2, ran
    if importlib.util.find_spec("hpcreduce.ps.colocated") is not None:
        assert ran["hpcreduce_colocated"]["trainers"] == 3 and ran["hpcreduce_tablewise"]["trainers"] == 3, ran
    assert len(result["peak_rss_bytes"]) == 3 and min(result["peak_rss_bytes"]) > 0, result


def test_replicas_on_one_server_are_refused_before_any_rank_starts(tmp_path):
    job = hpcreduce_cli("bench", "embeddings", "-n", "2", "--parts", "scale", "--replicas", timeout=TIMEOUT)
    assert job.returncode != 0 and "--replicas needs --servers 2 or more" in job.output, job


def test_table_wise_is_left_out_of_a_run_with_dynamic_tables_saying_why():
    pytest.importorskip("torch")
    from hpcreduce.benchmarks.embedding_peers import Shape, unavailable
    shape = Shape(2, 100, 4, 2, 8)
    assert "fixed tables only" in unavailable("hpcreduce_tablewise", None, 1, shape, True)
    assert unavailable("hpcreduce_tablewise", None, 1, shape, False) is None
