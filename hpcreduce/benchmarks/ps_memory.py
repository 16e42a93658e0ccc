"""``hpcreduce bench ps-memory``: each role's peak memory against its share of the model.

Run it outside any MPI job. For each ``--table-rows`` R (default 2**20 and 2**26), in
the same run, it launches ``hpcreduce train --model logreg --mode ps --ft --servers K
--table-rows R`` (replication on: each server also holds its predecessor's shard) on
``-n`` ranks and reads ``memory.peak_rss_bytes`` (the OS's peak RSS, by rank and role)
from its JSON. A server's *share* is its part of the model state, primary and replica:
2 x R/K rows x (weight + Adagrad accumulator), 8 bytes a row. The *base* is the peak
RSS of an interpreter that has imported hpcreduce's trainer and mpi4py, measured here.
Targets: a server's peak at most about 2 x share + base; a worker's peak the same at
every R.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from ..runtime.files import write_json
from .scaling import Launcher

NAME = "ps-memory"
HELP = "peak RSS of PS servers and workers against their share of the model, by table rows"
STATE_BYTES_PER_ROW = 8  # float32 weight + float32 Adagrad accumulator
BASE_PROBE = ("import mpi4py.MPI, hpcreduce.train.ps.ps_training; "
              "from hpcreduce.runtime.memory import peak_rss_bytes; print(peak_rss_bytes())")
MiB = float(1 << 20)


def drive(args) -> int:
    """Every run, from the driver process; prints the table, writes --json; exit status."""
    args.ft = True  # replication needs in-job fault tolerance
    launcher = Launcher(args)
    base = int(subprocess.run([sys.executable, "-c", BASE_PROBE], capture_output=True, text=True,
                              check=True, timeout=120).stdout.split()[-1])
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpcreduce-ps-memory-") as scratch:
        for table_rows in args.table_rows:
            rows.append(measure(launcher, Path(scratch), table_rows, base, args))
    result = {"benchmark": NAME, "ranks": args.ranks, "servers": args.servers, "steps": args.steps,
              "base_rss_bytes": base, "rows": rows}
    print(render(result), flush=True)
    if args.json_path:
        write_json(args.json_path, result)
    return 0


def measure(launcher: Launcher, scratch: Path, table_rows: int, base: int, args) -> Dict[str, Any]:
    """One run: the largest peak RSS of each role, the share of a server, their ratio."""
    stem = scratch / f"rows-{table_rows}"
    command = [sys.executable, "-m", "hpcreduce", "train", "--model", "logreg", "--mode", "ps", "--ft",
               "--servers", str(args.servers), "--table-rows", str(table_rows), "--steps", str(args.steps),
               "--quiet", "--json", f"{stem}.json"]
    print(f"hpcreduce bench ps-memory: R = {table_rows} on {args.ranks} ranks ...", file=sys.stderr, flush=True)
    launcher.run(args.ranks, command, Path(f"{stem}.log"))
    memory = json.loads(Path(f"{stem}.json").read_text())["memory"]
    peaks: Dict[str, List[int]] = {}
    for peak, role in zip(memory["peak_rss_bytes"], memory["roles"]):
        peaks.setdefault(role, []).append(peak)
    share = 2 * -(-table_rows // args.servers) * STATE_BYTES_PER_ROW
    server = max(peaks["server"])
    return {"table_rows": table_rows, "share_bytes": share, "server_peak_bytes": server,
            "worker_peak_bytes": max(peaks["worker"]), "server_peaks": peaks["server"],
            "worker_peaks": peaks["worker"], "server_over_share": (server - base) / share}


def render(result: Dict[str, Any]) -> str:
    base = result["base_rss_bytes"]
    lines = [f"peak RSS by role, {result['servers']} servers with replication, {result['ranks']} ranks, "
             f"{result['steps']} steps (MiB; base interpreter {base / MiB:.0f})",
             f"{'R':>10} {'share/server':>13} {'server peak':>12} {'(peak-base)/share':>18} {'worker peak':>12}"]
    for row in result["rows"]:
        lines.append(f"{row['table_rows']:>10} {row['share_bytes'] / MiB:13.0f} {row['server_peak_bytes'] / MiB:12.0f} "
                     f"{row['server_over_share']:18.2f} {row['worker_peak_bytes'] / MiB:12.0f}")
    return "\n".join(lines)
