"""``hpcreduce export DIR --out model.npz``: assemble a whole PS model from its shards.

DIR is a ``hpcreduce train --mode ps --model-dir`` folder (shards and a manifest) or a
``--checkpoint-dir`` folder (its latest complete checkpoint, written by any number of
servers). The whole model is written as one ``.npz`` of named tables, atomically. Runs on
one process, no MPI job; it holds the whole model, which is what it is asked for.
"""
from __future__ import annotations

import argparse
import os
from typing import List

from ..errors import Problem
from .checks import refuse


def register(subcommands) -> None:
    parser = subcommands.add_parser("export", help="assemble a whole PS model from its shards into one .npz",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", metavar="DIR", help="a --model-dir or --checkpoint-dir folder")
    parser.add_argument("--out", required=True, metavar="PATH", help="the .npz to write")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, argv) -> int:
    from ..runtime.places import Place, place_problems
    problems: List[Problem] = [] if os.path.isdir(args.directory) else [f"DIR {args.directory} is not a folder"]
    problems += place_problems([Place("DIR", args.directory, folder=True, output=False), Place("--out", args.out)])
    if problems:
        return refuse("export", problems)
    from ..train.ps.export import whole_model, write_whole
    params, about = whole_model(args.directory)
    write_whole(args.out, params)
    tables = ", ".join(f"{name} {tuple(value.shape)}" for name, value in params.items())
    print(f"hpcreduce export: {about['identity'].get('model')} at step {about['step']} from "
          f"{len(about['shards'])} shard(s) -> {args.out}: {tables}")
    return 0
