"""The flags of each ``hpcreduce bench`` benchmark, and the checks of the ones that drive jobs."""
from __future__ import annotations

import argparse
import importlib.util
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, List, Sequence, Tuple

from ..benchmarks import (allreduce, c10d, embeddings, ps, ps_memory, recovery, scaling, soak, soak_plan,
                          stragglers, torch_ddp)
from ..arrays.dtypes import WIRE
from ..benchmarks.timing import sizes_argument
from ..runtime.options import parse_size
from ..runtime.environment import detect_launcher
from ..runtime.files import path_problem


def allreduce_flags(parser: argparse.ArgumentParser) -> None:
    sizes = allreduce.DEFAULT_SIZES
    parser.add_argument("--device", choices=tuple(sizes), default="cpu",
                        help="cpu: numpy arrays; gpu: cupy arrays, one GPU per rank by its rank "
                             "on the node (ranks may share one), NCCL as the peer (default cpu)")
    parser.add_argument("--sizes", type=size_list, default=None,
                        help="message sizes in bytes, comma-separated (K, M suffixes; default "
                             + "; ".join(f"{device}: {text}" for device, text in sizes.items()) + ")")
    parser.add_argument("--fusion-arrays", type=int, default=100, help="arrays in the fusion case")
    parser.add_argument("--fusion-elements", type=int, default=10_000, help="float32 elements per array")
    parser.add_argument("--links", action="store_true",
                        help="also time ping-pongs within a node and between nodes (the two-link cost model)")


def ps_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", type=int, default=None,
                        help="number of server ranks K (default: every K from 1 to N-1)")
    parser.add_argument("--sizes", type=size_list, default=size_list(ps.DEFAULT_SIZES),
                        help=f"dense table sizes in bytes (default {ps.DEFAULT_SIZES})")
    parser.add_argument("--rows", type=int, default=4096, help="rows per pull_rows/push_rows")
    parser.add_argument("--width", type=int, default=16, help="float32 elements per sparse row")
    parser.add_argument("--wire-dtype", dest="wire_dtype", choices=WIRE, default="float32",
                        help="how pushed and pulled values travel (the raw peer moves the same bytes; default float32)")
    parser.add_argument("--table-rows", type=int, default=1 << 18, help="rows of the sparse table")
    parser.add_argument("--rounds", type=int, default=5, help="PS and raw blocks per case")


def scaling_flags(parser: argparse.ArgumentParser) -> None:
    counts = scaling.counts_argument
    parser.set_defaults(ranks=8)
    parser.add_argument("--counts", type=counts, default=None,
                        help="rank counts to run, e.g. 1,2,4,8 (default: powers of two up to -n, and -n)")
    parser.add_argument("--no-ps", dest="ps", action="store_false",
                        help="ring runs only (they always run: the baseline, and the bytes per step)")
    parser.add_argument("--model", default="logreg", help="built-in model to train (default logreg)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the rates (default 3)")
    parser.add_argument("--batch", type=int, default=None,
                        help="global batch (with --weak: per worker; default: the model's)")
    parser.add_argument("--weak", action="store_true", help="weak scaling: the batch per worker stays fixed")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="train and fit the allreduce on numpy (cpu) or on each rank's GPU (gpu; default cpu)")
    parser.add_argument("--servers", type=int, default=1, help="PS server ranks K (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    parser.add_argument("--sizes", type=size_list, default=size_list(scaling.DEFAULT_SIZES),
                        help=f"allreduce message sizes for the alpha-beta fit (default {scaling.DEFAULT_SIZES})")
    parser.add_argument("--fit-ranks", type=int, default=None,
                        help="ranks of the allreduce fit (default: the most not oversubscribed, >= 2)")
    parser.add_argument("--predict", type=counts, default=counts(scaling.DEFAULT_PREDICT),
                        help=f"rank counts to forecast (default {scaling.DEFAULT_PREDICT})")
    parser.add_argument("--predict-nodes", type=counts, default=counts(scaling.DEFAULT_PREDICT),
                        help="node counts to forecast with the two links, ranks per node as in the fit run "
                             f"(default {scaling.DEFAULT_PREDICT})")
    launcher_flags(parser, timeout=600)
    parser.add_argument("--out", default="hpcreduce-scaling", help="folder for every output (default %(default)s)")


def recovery_flags(parser: argparse.ArgumentParser) -> None:
    cases = ",".join(recovery.CASES)
    parser.add_argument("--counts", default="4,8", help="rank counts, comma-separated (default 4,8)")
    parser.add_argument("--cases", default=cases, help=f"cases (default {cases})")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case and count (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    parser.add_argument("--batch", type=int, default=1024, help="global batch (default 1024)")
    launcher_flags(parser, timeout=120)


def stragglers_flags(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(ranks=6)
    parser.add_argument("--servers", type=int, default=1, help="server ranks K (default 1)")
    parser.add_argument("--model", default="logreg", help="built-in model to train (default logreg)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    parser.add_argument("--batch", type=int, default=65536, help="Sandblaster: examples per pass (default 65536)")
    parser.add_argument("--unit", type=int, default=1024, help="Sandblaster: examples per work unit (default 1024)")
    parser.add_argument("--history", type=int, default=10, help="L-BFGS memory (default 10)")
    parser.add_argument("--steps", type=int, default=8, help="L-BFGS iterations of the straggler runs (default 8)")
    parser.add_argument("--factor", type=float, default=4.0, help="the slow worker's factor (default 4)")
    parser.add_argument("--target", type=float, default=0.77, help="held-out accuracy to reach (default 0.77)")
    parser.add_argument("--methods", default=",".join(stragglers.METHODS),
                        help="time-to-accuracy methods, of %(default)s (empty: none)")
    parser.add_argument("--lbfgs-steps", default="2,4,8,16,32", help="L-BFGS budgets, ascending (default %(default)s)")
    parser.add_argument("--sgd-steps", default="25,50,100,200,400",
                        help="Downpour and ring budgets in steps, ascending (default %(default)s)")
    parser.add_argument("--sgd-batch", type=int, default=4096, help="Downpour and ring global batch (default 4096)")
    launcher_flags(parser, timeout=600)


def ps_memory_flags(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(ranks=6)
    parser.add_argument("--servers", type=int, default=4, help="server ranks K (default 4)")
    parser.add_argument("--table-rows", type=size_list, default=[1 << 20, 1 << 26],
                        help="logreg table rows R to compare, powers of two (default 1M,64M)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    launcher_flags(parser, timeout=900)


def torch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="mlp,cnn", help="models to time, comma-separated (mlp, cnn)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="bucket size of both DDPs in MB (default 25, torch DDP's)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    parser.add_argument("--iterations", type=int, default=60, help="timed rounds (default 60)")
    parser.add_argument("--settle", type=int, default=2,
                        help="untimed steps each candidate runs before its timed one in every round, so it is "
                             "timed in its own steady state, as in a training loop, not cold after another "
                             "candidate (default 2; 0: one step each, cold)")


def torch_problems(args: argparse.Namespace) -> List[str]:
    unknown = sorted(set(args.models.split(",")) - {"mlp", "cnn"})
    problems = [f"--models: unknown model(s) {', '.join(unknown)} (known: mlp, cnn)"] if unknown else []
    if importlib.util.find_spec("torch") is None:
        problems.append("bench torch needs torch: pip install 'hpcreduce[torch]'")
    return problems + at_least(args, 1, "--warmup", "--iterations") + at_least(args, 0, "--settle") + \
        ([] if args.bucket_cap_mb > 0 else [f"--bucket-cap-mb must be above 0, got {args.bucket_cap_mb:g}"])


def c10d_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="hpcreduce", help="the default group's backend (default hpcreduce)")
    parser.add_argument("--sizes", type=size_list, default=[64 << 10, 1 << 20, 16 << 20],
                        help="message sizes, comma-separated (default 64K,1M,16M)")
    parser.add_argument("--ops", default=",".join(c10d.OPERATIONS),
                        help="operations to time, comma-separated (default: all)")
    parser.add_argument("--steps", default="ddp_mlp,ddp_cnn,fsdp2_mlp",
                        help="training steps to time, comma-separated (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    parser.add_argument("--most", type=int, default=100, help="most timed rounds of an operation (default 100)")
    parser.add_argument("--step-iterations", type=int, default=30, help="timed rounds of each step (default 30)")
    parser.add_argument("--settle", type=int, default=2, help="untimed steps before each timed one (default 2)")


def c10d_problems(args: argparse.Namespace) -> List[str]:
    unknown = sorted(set(args.ops.split(",")) - set(c10d.OPERATIONS))
    problems = [f"--ops: unknown operation(s) {', '.join(unknown)}"] if unknown else []
    unknown = sorted(set(args.steps.split(",")) - set(c10d.STEP_TARGETS))
    problems += [f"--steps: unknown step(s) {', '.join(unknown)} (known: {', '.join(c10d.STEP_TARGETS)})"] \
        if unknown else []
    if importlib.util.find_spec("torch") is None:
        problems.append("bench c10d needs torch: pip install 'hpcreduce[torch]'")
    return problems + at_least(args, 1, "--warmup", "--most", "--step-iterations") + at_least(args, 0, "--settle")


def embeddings_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", type=part_list, default=list(embeddings.PARTS),
                        help=f"parts to run, comma-separated (default {','.join(embeddings.PARTS)})")
    parser.add_argument("--servers", type=int, default=1, help="server ranks K of rows and scale (default 1)")
    rows = parser.add_argument_group("rows")
    rows.add_argument("--rows", type=int, default=4096, help="ids per pull+push (default %(default)s)")
    rows.add_argument("--width", type=int, default=16, help="float32 elements per row (default %(default)s)")
    rows.add_argument("--table-rows", type=count, default=1 << 20, help="rows of the table (default 1M)")
    rows.add_argument("--rounds", type=int, default=5, help="PS and raw blocks (default %(default)s)")
    rows.add_argument("--reps", type=int, default=20, help="calls per block (default %(default)s)")
    scale = parser.add_argument_group("scale")
    scale.add_argument("--ids", type=count, default=1 << 20,
                       help="distinct ids in the stream (K, M, G: powers of two; default 1M; the issue's: 1G)")
    scale.add_argument("--push-rows", type=count, default=1 << 16, help="ids per push (default 64K)")
    scale.add_argument("--budget", type=count, default=64 << 20,
                       help="the table's bytes per server shard, values, optimizer state and index (0: unbounded; "
                            "default 64M)")
    scale.add_argument("--admit-after", type=int, default=1, help="pushes of an id before it gets a row (default 1)")
    scale.add_argument("--eviction", choices=("lru", "lfu"), default="lru", help="which rows go first (default lru)")
    scale.add_argument("--replicas", action="store_true",
                       help="each server also holds its predecessor's shard (as --ft training does; K >= 2)")
    scale.add_argument("--rss-points", type=int, default=5, help="worker RSS samples along the stream (default 5)")
    peers = parser.add_argument_group("peers")
    peers.add_argument("--peers", default="torch_ddp,torchrec,hpcreduce,hpcreduce_colocated,hpcreduce_tablewise",
                       help="candidates, comma-separated (default %(default)s; one that cannot run is reported why)")
    peers.add_argument("--fields", type=int, default=8, help="sparse fields, one embedding table each (default 8)")
    peers.add_argument("--field-rows", type=count, default=100_000, help="rows of each field's table (default 100000)")
    peers.add_argument("--dim", type=int, default=16, help="embedding dimension (default %(default)s)")
    peers.add_argument("--bag", type=int, default=4, help="ids per field per example (default %(default)s)")
    peers.add_argument("--batch", type=int, default=256, help="examples per rank per step (default %(default)s)")
    peers.add_argument("--dynamic-tables", action="store_true",
                       help="hpcreduce's tables dynamic (a row made when its id is first pushed; default: fixed, "
                            "as TorchRec's)")
    peers.add_argument("--warmup", type=int, default=3, help="untimed steps of each candidate (default 3)")
    peers.add_argument("--iterations", type=int, default=20, help="timed steps of each candidate (default 20)")


def embeddings_problems(args: argparse.Namespace) -> List[str]:
    """What stops ``bench embeddings`` with these flags (empty when fine)."""
    found = at_least(args, 1, "--servers", "--rows", "--width", "--table-rows", "--rounds", "--reps", "--ids",
                     "--push-rows", "--admit-after", "--rss-points", "--fields", "--field-rows", "--dim", "--bag",
                     "--batch", "--iterations") + at_least(args, 0, "--budget", "--warmup")
    if "scale" in args.parts and args.replicas and args.servers < 2:
        found.append(f"--replicas needs --servers 2 or more (a shard's replica is on the next server), "
                     f"got {args.servers}")
    if "scale" in args.parts and 0 < args.budget < args.push_rows * args.width * 4:
        found.append(f"--budget {args.budget} is smaller than one push's rows "
                     f"({args.push_rows} x {args.width} float32)")
    if "peers" in args.parts:
        known = ("torch_ddp", "torchrec", "hpcreduce", "hpcreduce_colocated", "hpcreduce_tablewise")
        unknown = sorted(set(args.peers.split(",")) - set(known))
        if unknown:
            found.append(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(known)})")
        if importlib.util.find_spec("torch") is None:
            found.append("bench embeddings --parts peers needs torch: pip install 'hpcreduce[torch]'")
    return found


def part_list(text: str) -> List[str]:
    """``--parts``: known part names, comma-separated, in the benchmark's order."""
    named = [part for part in text.split(",") if part]
    unknown = sorted(set(named) - set(embeddings.PARTS))
    if unknown or not named:
        raise argparse.ArgumentTypeError(f"{text!r}: give parts of {', '.join(embeddings.PARTS)}, comma-separated")
    return [part for part in embeddings.PARTS if part in named]


def count(text: str) -> int:
    """A whole number, with K, M, G for powers of two (``1G`` = 2**30)."""
    try:
        return parse_size(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a count such as 4096, 64K or 1G") from None


def launcher_flags(parser: argparse.ArgumentParser, *, timeout: float) -> None:
    """How a benchmark that drives jobs starts each of them."""
    parser.add_argument("--launcher", choices=("mpirun", "srun"), default="mpirun",
                        help="how to start each run (default mpirun, through hpcreduce's launcher)")
    parser.add_argument("--launcher-args", default="",
                        help="added to every launch, e.g. '--mpi=pmix' (srun) or '--bind-to core'")
    parser.add_argument("--timeout", type=float, default=timeout,
                        help="seconds a run may take (default %(default)s)")


def size_list(text: str) -> Sequence[int]:
    """``--sizes``: message sizes of at least 4 bytes (one float32), e.g. ``4K,1M``."""
    try:
        parsed = sizes_argument(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of sizes such as 4K,1M") from None
    if not parsed or min(parsed) < 4:
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes of at least 4 bytes (one float32)")
    return parsed


def at_least(args: argparse.Namespace, least: float, *flags: str) -> List[str]:
    """The problem of each of ``flags`` (given ones only) whose value is below ``least`` or not a number."""
    found = []
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and not least <= value < float("inf"):
            found.append(f"{flag} must be at least {least:g}, got {value}")
    return found


def allreduce_problems(args: argparse.Namespace) -> List[str]:
    return at_least(args, 1, "--fusion-arrays", "--fusion-elements")


def ps_problems(args: argparse.Namespace) -> List[str]:
    return at_least(args, 1, "--servers", "--rows", "--width", "--table-rows", "--rounds")


def recovery_problems(args: argparse.Namespace) -> List[str]:
    """What stops ``bench recovery`` with these flags (empty when fine)."""
    found = at_least(args, 1, "--repeats", "--batch") + at_least(args, recovery.LATEST_STEP + 1, "--steps")
    found += at_least(args, 1e-3, "--timeout")
    try:
        counts = [int(part) for part in args.counts.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2:
        found.append(f"--counts must be rank counts of at least 2, comma-separated, got {args.counts!r}")
    unknown = [case for case in args.cases.split(",") if case and case not in recovery.CASES]
    if unknown:
        found.append(f"--cases: unknown {', '.join(map(repr, unknown))}; known: {', '.join(recovery.CASES)}")
    return found + _outside_jobs("recovery")


def scaling_problems(args: argparse.Namespace) -> List[str]:
    """What stops ``bench scaling`` with these flags (empty when fine)."""
    found = at_least(args, 1, "--batch") + at_least(args, 2, "--fit-ranks") + at_least(args, 1e-3, "--timeout")
    why = path_problem(os.path.join(args.out, "scaling.json"))
    if why:
        found.append(f"--out {args.out}: {why}")
    if args.steps <= args.warmup or args.warmup < 0:
        found.append(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}) >= 0")
    if args.counts is not None and (not args.counts or args.counts[0] < 1 or args.counts[-1] < 2):
        found.append("--counts must be positive rank counts, one at least 2 (the forecast needs "
                     "the bytes a multi-rank step moves)")
    if args.servers < 1 or (args.predict and min(args.predict) < 2) or \
            (args.predict_nodes and min(args.predict_nodes) < 2):
        found.append("--servers must be >= 1 and --predict and --predict-nodes counts >= 2")
    if args.counts is None and args.ranks < 2:
        found.append(f"-n must be at least 2, got {args.ranks}")
    if args.ft:
        found.append("--ft does not apply: the runs measure training without fault tolerance")
    return found + _outside_jobs("scaling")


def stragglers_problems(args: argparse.Namespace) -> List[str]:
    """What stops ``bench stragglers`` with these flags (empty when fine)."""
    found = at_least(args, 1, "--servers", "--batch", "--unit", "--history", "--steps", "--sgd-batch", "--factor")
    found += at_least(args, 1e-3, "--timeout")
    if args.unit > args.batch:
        found.append(f"--unit ({args.unit}) must not exceed --batch ({args.batch})")
    if args.ranks < args.servers + 3:
        found.append(f"-n must be at least --servers + 3 ({args.servers + 3}: the servers, a coordinator and two "
                     f"workers, one of them slow), got {args.ranks}")
    if not 0 < args.target <= 1:
        found.append(f"--target must be an accuracy in (0, 1], got {args.target}")
    for flag in ("--lbfgs-steps", "--sgd-steps"):
        try:
            stragglers.step_list(getattr(args, flag[2:].replace("-", "_")))
        except ValueError as err:
            found.append(f"{flag} {err}")
    unknown = [method for method in args.methods.split(",") if method and method not in stragglers.METHODS]
    if unknown:
        found.append(f"--methods: unknown {', '.join(map(repr, unknown))}; known: {', '.join(stragglers.METHODS)}")
    if args.ft:
        found.append("--ft does not apply: the runs measure stragglers, not failures")
    return found + _outside_jobs("stragglers")


def ps_memory_problems(args: argparse.Namespace) -> List[str]:
    """What stops ``bench ps-memory`` with these flags (empty when fine)."""
    found = at_least(args, 1, "--servers", "--steps")
    if args.servers is not None and args.ranks is not None and not 1 <= args.servers < args.ranks:
        found.append(f"--servers K needs 1 <= K < ranks ({args.ranks}), got {args.servers}")
    found += [f"--table-rows: {rows} is not a power of two from 2 to 2**40" for rows in args.table_rows
              if not 2 <= rows <= 2**40 or rows & (rows - 1)]
    return found + _outside_jobs("ps-memory")


def soak_flags(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(ranks=6)
    parser.add_argument("--runs", type=int, default=50, help="runs to draw (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the draws (default %(default)s; -n is the "
                        f"most ranks a run gets, from {soak_plan.FEWEST_RANKS})")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default %(default)s)")
    parser.add_argument("--batch", type=int, default=1024, help="global batch (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=soak.DEFAULT_TOLERANCE,
                        help="SSP and ASP: the final loss's relative band around the quiet run's (default "
                             f"%(default)s; ring and BSP: {soak.EXACT_TOLERANCE:g})")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a run may take (default %(default)s)")
    parser.add_argument("--out", default="hpcreduce-soak",
                        help="folder for each run's output, JSON and kill log (default %(default)s)")


def soak_problems(args: argparse.Namespace) -> List[str]:
    """What stops ``bench soak`` with these flags (empty when fine)."""
    found = at_least(args, 1, "--runs", "--batch") + at_least(args, soak_plan.FEWEST_STEPS, "--steps")
    found += at_least(args, 1e-3, "--timeout") + at_least(args, 0, "--tolerance")
    if args.ranks < soak_plan.FEWEST_RANKS:
        found.append(f"-n (the most ranks a run gets) must be at least {soak_plan.FEWEST_RANKS}, got {args.ranks}")
    if args.restarts:
        found.append("--restarts does not apply: the runs recover in-job (--ft)")
    why = path_problem(os.path.join(args.out, "run.json"))
    if why:
        found.append(f"--out {args.out}: {why}")
    return found + _outside_jobs("soak")


def _outside_jobs(name: str) -> List[str]:
    if detect_launcher() == "none":
        return []
    return [f"bench {name} launches its own jobs: run it outside mpirun and srun "
            "(on a login node or in the batch script itself)"]


@dataclass(frozen=True)
class Benchmark:
    """One ``hpcreduce bench NAME``: its module (``NAME``, ``HELP``, ``run`` and ``render``, or
    ``drive``), its flags and the checks of their values."""

    module: ModuleType
    flags: Callable[[argparse.ArgumentParser], None]
    problems: Callable[[argparse.Namespace], List[str]]


BENCHMARKS: Tuple[Benchmark, ...] = (
    Benchmark(allreduce, allreduce_flags, allreduce_problems), Benchmark(ps, ps_flags, ps_problems),
    Benchmark(ps_memory, ps_memory_flags, ps_memory_problems), Benchmark(scaling, scaling_flags, scaling_problems),
    Benchmark(recovery, recovery_flags, recovery_problems),
    Benchmark(stragglers, stragglers_flags, stragglers_problems), Benchmark(soak, soak_flags, soak_problems),
    Benchmark(torch_ddp, torch_flags, torch_problems), Benchmark(embeddings, embeddings_flags, embeddings_problems),
    Benchmark(c10d, c10d_flags, c10d_problems))
"""The benchmarks, in the order ``hpcreduce bench --help`` lists them."""
