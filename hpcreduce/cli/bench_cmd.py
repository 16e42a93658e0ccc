"""``hpcreduce bench NAME``: run a benchmark on N ranks, print its table, write its JSON.

Each benchmark module offers ``NAME``, ``HELP``, ``run(context, args) -> dict``
(collective) and ``render(result) -> str``, or ``drive(args)`` when it launches its own
jobs; its flags are in ``bench_flags``.
"""
from __future__ import annotations

import sys

from ..benchmarks import allreduce as allreduce_bench
from ..benchmarks import ps as ps_bench
from ..benchmarks import recovery as recovery_bench
from ..benchmarks import scaling as scaling_bench
from ..runtime.files import write_json
from .bench_flags import FLAGS, PROBLEMS
from .flags import flag_names
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
        FLAGS[module.NAME](sub)
        sub.set_defaults(run=run, module=module, flags=flag_names(sub))


def run(args, argv) -> int:
    problems = PROBLEMS.get(args.module.NAME, lambda _: [])(args)
    if problems:
        for problem in problems:
            print(f"hpcreduce bench {args.module.NAME}: {problem}", file=sys.stderr)
        return 2
    if hasattr(args.module, "drive"):  # launches its own jobs (bench scaling, bench recovery)
        return args.module.drive(args)
    exit_code = relaunch_outside_mpi(args, argv)
    if exit_code is not None:
        return exit_code
    from ..runtime.context import init
    context = init(ft=True if args.ft else None)
    result = args.module.run(context, args)
    if context.rank == 0:
        print(args.module.render(result), flush=True)
        if args.json_path:
            write_json(args.json_path, result)
            print(f"wrote {args.json_path}", file=sys.stderr)
    return 0
