#!/usr/bin/env bash
# Issue 34's rows-path measurements (compiled kernels, idle servers), each a ratio against its peer
# measured in the same run (raw point-to-point of the same bytes), except the scale stream's rate.
# Results in bench/out/ (OUT=... to change). Run on a quiet machine; record `cat /proc/loadavg`.
#
#   bash bench/rows_path.sh
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)/out}
mkdir -p "$OUT"
cat /proc/loadavg | tee "$OUT/rows-path-load.txt"
# dense push+pull at 64 KiB against raw + update (target >= 0.6x), a small request's round trip
# against raw (target <= 3x), the idle server's CPU share (target < 10% of a core), pull_rows/push_rows
hpcreduce bench ps -n 2 --servers 1 --sizes 64K --rows 4096 --width 16 --table-rows 1048576 --rounds 7 \
    --json "$OUT/rows-path-ps.json" | tee "$OUT/rows-path-ps.txt"
# a sparse pull+push of 4096 ids x 16 floats against raw point-to-point of the same bytes (target >= 0.3x)
hpcreduce bench embeddings --parts rows -n 2 --servers 1 --rows 4096 --width 16 --rounds 7 \
    --json "$OUT/rows-path-rows.json" | tee "$OUT/rows-path-rows.txt"
# the shortened scale stream (the old figure: 1.09 M ids/s at 16M ids, -n 12 --servers 8 --replicas)
hpcreduce bench embeddings --parts scale -n 12 --servers 8 --replicas --ids 16M --push-rows 256K --budget 512M \
    --json "$OUT/rows-path-scale.json" | tee "$OUT/rows-path-scale.txt"
cat /proc/loadavg | tee -a "$OUT/rows-path-load.txt"
