"""``hpcreduce bench NAME``: run a benchmark on N ranks, print its table, write its JSON.

Each benchmark module offers ``NAME``, ``HELP``, ``add_arguments(parser)``,
``run(context, args) -> dict`` (collective) and ``render(result) -> str``.
"""
from __future__ import annotations

import json
import sys

from ..benchmarks import allreduce as allreduce_bench
from ..benchmarks import ps as ps_bench
from ..benchmarks import recovery as recovery_bench
from ..benchmarks import scaling as scaling_bench
from .ranks import add_rank_options, relaunch_outside_mpi

BENCHMARKS = (allreduce_bench, ps_bench, scaling_bench, recovery_bench)


def register(subcommands) -> None:
    parser = subcommands.add_parser("bench", help="measure hpcreduce against MPI in the same run",
                                    description=__doc__)
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for module in BENCHMARKS:
        sub = benchmarks.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        add_rank_options(sub)
        sub.add_argument("--json", dest="json_path", help="write every measured row to this file")
        module.add_arguments(sub)
        sub.set_defaults(run=run, module=module)


def run(args, argv) -> int:
    if hasattr(args.module, "drive"):  # launches its own jobs (bench scaling)
        return args.module.drive(args)
    exit_code = relaunch_outside_mpi(args, argv)
    if exit_code is not None:
        return exit_code
    import hpcreduce
    context = hpcreduce.init(ft=True if args.ft else None)
    result = args.module.run(context, args)
    if context.rank == 0:
        print(args.module.render(result), flush=True)
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as handle:
                json.dump(result, handle, indent=1)
            print(f"wrote {args.json_path}", file=sys.stderr)
    return 0
