#!/usr/bin/env bash
# Issue 25's measurements of embedding tables (hpcreduce bench embeddings), one part a run, at full size.
# Run on a quiet machine: each part compares candidates in the same run, but the scale stream is
# an absolute rate and the peers' RSS is the machine's. Results in bench/out/ (OUT=... to change).
#
#   bash bench/embeddings.sh                # every part at the issue's sizes (the scale stream takes long)
#   SMOKE=1 bash bench/embeddings.sh        # every part at tiny sizes, about a minute
#
# The peers part times TorchRec where it imports. It is not a dependency of hpcreduce:
#   pip install torchrec && pip install --no-deps --force-reinstall fbgemm-gpu-cpu
# (torchrec pulls the CUDA fbgemm-gpu, which does not import without CUDA; on CPU only table-wise
# sharding runs). Both must be built for the installed torch; where torchrec does not import the
# JSON's peers.left_out says why and the other candidates run. A venv of its own works: run this
# script with HPCREDUCE="/path/to/trvenv/bin/python -m hpcreduce" (that venv needs mpi4py and numpy).
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)/out}
HPCREDUCE=${HPCREDUCE:-hpcreduce}
mkdir -p "$OUT"
if [ -n "${SMOKE:-}" ]; then
    ROWS=(-n 3 --servers 2 --rows 1024 --table-rows 64K --rounds 2 --reps 5)
    SCALE=(-n 4 --servers 2 --replicas --ids 1M --push-rows 64K --budget 16M)
    PEERS=(-n 3 --servers 1 --field-rows 10K --iterations 5 --warmup 1)
    PEERS_SMALL=(-n 2 --servers 1 --field-rows 1K --iterations 3 --warmup 1)
    PEERS_WIDE=(-n 2 --servers 1 --fields 4 --field-rows 1K --dim 64 --iterations 3 --warmup 1)
    UNFIT=(-n 3 --servers 1 --fields 8 --field-rows 200M --dynamic-tables --iterations 3 --warmup 1)
    LEARN=(--steps 50)
else
    # 4096 ids x 16 floats per pull+push, K=2 servers and 2 workers
    ROWS=(-n 4 --servers 2 --rows 4096 --width 16 --table-rows 16M --rounds 7 --reps 20)
    # 2**30 distinct ids over 8 servers with replicas, 512 MiB a shard (1 GiB a server with its replica)
    SCALE=(-n 12 --servers 8 --replicas --ids 1G --push-rows 256K --budget 512M --rss-points 9)
    # issue 34's models, 2 processes each (hpcreduce's dedicated layout: 1 server + 1 trainer; colocated: 2
    # trainers), batch 512 per trainer: 26 fields (as Criteo's) of 1M rows (1.6 GiB of tables, replicated on
    # every torch DDP rank), 8 of 100K, and 16 of 200K x 64
    PEERS=(-n 2 --servers 1 --fields 26 --field-rows 1M --dim 16 --batch 512 --iterations 30)
    PEERS_SMALL=(-n 2 --servers 1 --fields 8 --field-rows 100K --dim 16 --batch 512 --iterations 30)
    PEERS_WIDE=(-n 2 --servers 1 --fields 16 --field-rows 200K --dim 64 --batch 512 --iterations 30)
    # tables no replica fits: 26 x 100M ids x 16 (166 GB a torch DDP rank); hpcreduce's dynamic tables hold
    # the rows trained
    UNFIT=(-n 4 --servers 1 --fields 26 --field-rows 100M --dim 16 --batch 2048 --dynamic-tables --iterations 30)
    LEARN=()
fi
$HPCREDUCE bench embeddings --parts rows "${ROWS[@]}" --json "$OUT/embeddings-rows.json" | tee "$OUT/embeddings-rows.txt"
$HPCREDUCE bench embeddings --parts scale "${SCALE[@]}" --json "$OUT/embeddings-scale.json" | tee "$OUT/embeddings-scale.txt"
$HPCREDUCE bench embeddings --parts peers "${PEERS[@]}" --json "$OUT/embeddings-peers.json" | tee "$OUT/embeddings-peers.txt"
$HPCREDUCE bench embeddings --parts peers "${PEERS_SMALL[@]}" --json "$OUT/embeddings-peers-small.json" \
    | tee "$OUT/embeddings-peers-small.txt"
$HPCREDUCE bench embeddings --parts peers "${PEERS_WIDE[@]}" --json "$OUT/embeddings-peers-wide.json" \
    | tee "$OUT/embeddings-peers-wide.txt"
$HPCREDUCE bench embeddings --parts peers "${UNFIT[@]}" --json "$OUT/embeddings-unfit.json" | tee "$OUT/embeddings-unfit.txt"
# Learning (issue 25): embed in hybrid mode against the Bayes accuracy, logistic regression on the same
# clicks, and eviction at budgets that hold the hot rows against the unbounded run (2 servers, 2 workers).
for run in "embed" "logreg-interaction" "embed --row-budget 240K" "embed --row-budget 160K" \
           "embed --admit-after 2 --row-budget 240K"; do
    name=$(echo "$run" | tr -d ' -')
    # shellcheck disable=SC2086
    hpcreduce train -n 4 --mode hybrid --servers 2 --consistency ssp --staleness 2 --model $run "${LEARN[@]}" \
        --json "$OUT/learn-$name.json" --progress none | tee "$OUT/learn-$name.txt"
done
echo "results in $OUT"
