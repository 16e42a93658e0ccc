"""``hpcreduce bench NAME``: run a benchmark on N ranks, print its table, write its JSON.

Each benchmark module offers ``NAME``, ``HELP``, ``run(context, args) -> dict``
(collective) and ``render(result) -> str``, or ``drive(args)`` when it launches its own
jobs; its flags are in ``bench_flags``.
"""
from __future__ import annotations

import sys
from typing import Dict, Optional

from ..benchmarks import allreduce as allreduce_bench
from ..benchmarks import c10d as c10d_bench
from ..benchmarks import embeddings as embeddings_bench
from ..benchmarks import ps as ps_bench
from ..benchmarks import ps_memory as ps_memory_bench
from ..benchmarks import recovery as recovery_bench
from ..benchmarks import scaling as scaling_bench
from ..benchmarks import soak as soak_bench
from ..benchmarks import stragglers as stragglers_bench
from ..benchmarks import torch_ddp as torch_bench
from ..runtime.files import write_json
from ..runtime.launch import mark_done
from .bench_flags import FLAGS, PROBLEMS
from .checks import launch_problems, output_problems, refuse, setting_problems
from .flags import flag_names
from .ranks import add_rank_options, outside_mpi, relaunch

BENCHMARKS = (allreduce_bench, ps_bench, ps_memory_bench, scaling_bench, recovery_bench, stragglers_bench,
              soak_bench, torch_bench, embeddings_bench, c10d_bench)


def register(subcommands) -> None:
    parser = subcommands.add_parser("bench", help="measure hpcreduce against MPI in the same run",
                                    description=__doc__)
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for module in BENCHMARKS:
        sub = benchmarks.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        add_rank_options(sub)
        sub.add_argument("--json", dest="json_path", help="write every measured row to this file")
        FLAGS[module.NAME](sub)
        sub.set_defaults(run=run, module=module, flags=flag_names(sub))


def run(args, argv) -> int:
    name = args.module.NAME
    drives = hasattr(args.module, "drive")  # launches its own jobs (bench scaling, recovery, stragglers, soak)
    if drives or outside_mpi():
        problems = [*PROBLEMS[name](args), *output_problems(_outputs(args)), *launch_problems(args),
                    *setting_problems()]
        if problems:
            return refuse(f"bench {name}", problems)
        return args.module.drive(args) if drives else relaunch(args, argv)
    from ..runtime.context import init
    context = init(ft=True if args.ft else None)
    problems = context.comm.bcast(  # rank 0 writes the JSON: it decides for every rank
        [*PROBLEMS[name](args), *output_problems(_outputs(args)), *setting_problems()] if context.rank == 0 else None)
    if problems:
        return refuse(f"bench {name}", problems, context.rank)
    result = args.module.run(context, args)
    if context.rank == 0:
        print(args.module.render(result), flush=True)
        if args.json_path:
            write_json(args.json_path, result)
            print(f"wrote {args.json_path}", file=sys.stderr)
        mark_done()  # the launcher takes a job that ends without this for one that did not finish
    return 0


def _outputs(args) -> Dict[str, Optional[str]]:
    """The files the benchmark writes, by flag."""
    return {"--json": args.json_path}
