"""``bench ps`` runs end to end on tiny cases and reports every row (no speed asserted).

Run under mpirun with 3 ranks.
"""
import argparse

import hpcreduce
from hpcreduce.benchmarks import ps
from hpcreduce.cli import bench_flags

ctx = hpcreduce.init()
parser = argparse.ArgumentParser()
bench_flags.ps_flags(parser)
args = parser.parse_args(["--sizes", "4K,96K", "--rows", "64", "--table-rows", "1000", "--rounds", "2"])
ps.IDLE_S = 0.2  # short: nothing is timed against it here
result = ps.run(ctx, args)
cases = [(row["servers"], row["case"]) for row in result["rows"]]
assert cases == [(k, c) for k in (1, 2) for c in ("dense push+pull", "dense push-pull", "dense push+pull",
                                                   "dense push-pull", "latency (pull)", "idle server", "pull_rows",
                                                   "push_rows")], cases
timed = [row for row in result["rows"] if row["case"] != "idle server"]
assert all(row["ps_s"] > 0 and row["raw_s"] > 0 and row["ratio"] > 0 for row in timed)
assert all(row["python_loop_s"] > 0 for row in timed if row["case"] == "latency (pull)")
assert all(0 <= row["cpu_share"] < 5 for row in result["rows"] if row["case"] == "idle server")
if ctx.rank == 0:
    text = ps.render(result)
    assert "side by side at 1 MiB dense push+pull: ps-lite 0.57 GB/s" in text, text
    assert text.count("the least a request costs in Python") == 2, text
    print(text)
    print("ps bench smoke: ok", flush=True)
