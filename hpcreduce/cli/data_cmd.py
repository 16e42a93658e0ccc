"""``hpcreduce data write DIR``: write a built-in model's data set as a data directory of .npy shards.

The directory (format in docs/data.md) is what ``hpcreduce train --data DIR`` reads:
each worker opens only the shards it owns. Runs in this process, no MPI. DIR must be
new or empty; the manifest is written last, so a directory with one is complete.
"""
from __future__ import annotations

import argparse
import os
from typing import List

from .checks import refuse
from .flags import flag_names


def register(subcommands) -> None:
    parser = subcommands.add_parser("data", help="write a built-in data set as a directory of .npy shards",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", metavar="write", help="the action (write)")
    parser.add_argument("dir", metavar="DIR", help="the directory to write (new or empty)")
    parser.add_argument("--model", default="logreg", metavar="NAME",
                        help="whose data: logreg (synthetic clicks, default) or mlp (digits)")
    parser.add_argument("--seed", type=int, default=0, metavar="SEED", help="seed of the data (default 0)")
    parser.add_argument("--shards", type=int, default=16, metavar="N", help="training shards (default 16)")
    parser.add_argument("--test-shards", type=int, default=4, metavar="N", help="held-out shards (default 4)")
    parser.add_argument("--examples", type=int, metavar="N",
                        help="write only the first N training examples (default: all)")
    parser.set_defaults(run=run, flags=flag_names(parser))


def problems(args: argparse.Namespace) -> List[str]:
    """What stops the write, by flag."""
    from ..train.models import BUILTIN
    found = []
    if args.action != "write":
        found.append(f"the action must be write, got {args.action!r}")
    if args.model not in BUILTIN:
        found.append(f"--model must be one of {', '.join(BUILTIN)}, got {args.model!r}")
    if args.seed < 0:
        found.append(f"--seed must be >= 0, got {args.seed}")
    if args.shards < 1 or args.test_shards < 1:
        found.append(f"--shards and --test-shards must be at least 1, got {args.shards} and {args.test_shards}")
    if args.examples is not None and args.examples < 1:
        found.append(f"--examples must be at least 1, got {args.examples}")
    if os.path.exists(args.dir) and not (os.path.isdir(args.dir) and not os.listdir(args.dir)):
        found.append(f"DIR {args.dir} exists and is not an empty directory")
    return found


def run(args: argparse.Namespace, argv: List[str]) -> int:
    found = problems(args)
    if found:
        return refuse("data", found, 0, args.flags)
    from ..train.data_dir import write_data_dir
    from ..train.models import build
    _, dataset = build(args.model, args.seed)
    manifest = write_data_dir(dataset, args.dir, train_shards=args.shards, test_shards=args.test_shards,
                              examples=args.examples)
    splits = manifest["splits"]
    print(f"hpcreduce data: wrote {dataset.name} to {args.dir}: {sum(splits['train'])} training examples in "
          f"{len(splits['train'])} shards, {sum(splits['test'])} held out in {len(splits['test'])}, arrays "
          + ", ".join(f"{name} {spec['dtype']} {spec['shape']}" for name, spec in manifest["arrays"].items()))
    return 0
