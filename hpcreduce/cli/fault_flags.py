"""The fault-tolerance flags of ``hpcreduce train``: injected failures, growth, checkpoints, deadlines."""
from __future__ import annotations

import argparse
from typing import List, Tuple

from ..ft.faults import FaultConfig, parse_slow
from ..ft.resize import parse_grow, parse_leave
from ..ft.inject import parse_kill, parse_kill_node


def add_fault_flags(parser: argparse.ArgumentParser) -> None:
    """The flags; each sets the ``FaultConfig`` field of its ``dest`` (``--kill``: ``kills``)."""
    group = parser.add_argument_group("fault tolerance and growth (in-job recovery needs --ft)")
    group.add_argument("--kill", dest="kills", action="append", default=[], metavar="RANK@STEP[:PHASE]",
                       help="SIGKILL rank RANK at step STEP (phase step, recovery or checkpoint); repeatable")
    group.add_argument("--kill-node", dest="node_kills", action="append", default=[], metavar="NODE@STEP[:PHASE]",
                       help="SIGKILL every rank on node NODE (its hostname) at step STEP: a node lost; repeatable")
    group.add_argument("--kill-random", type=float, default=0.0, metavar="P",
                       help="each step, kill one random rank (never rank 0) with probability P")
    group.add_argument("--kill-seed", type=int, metavar="SEED",
                       help="seed of --kill-random's draws (default: --seed)")
    group.add_argument("--grow", action="append", default=[], metavar="N@STEP",
                       help="spawn N more ranks before step STEP; repeatable")
    group.add_argument("--grow-servers", action="append", default=[], metavar="N@STEP",
                       help="ps: spawn N more shard servers before step STEP (placement rebalanced); repeatable")
    group.add_argument("--leave", action="append", default=[], metavar="ID@STEP",
                       help="the rank with stable id ID leaves gracefully before step STEP (its data shards "
                            "go to the others); repeatable")
    group.add_argument("--discover", metavar="FILE",
                       help="a file holding the wanted number of ranks, or HOST[:SLOTS] lines (Horovod's "
                            "discovery format), polled between steps: the job grows or shrinks to it")
    group.add_argument("--discover-every", type=int, default=1, metavar="STEPS",
                       help="poll --discover every STEPS steps (default 1)")
    group.add_argument("--replace", action="store_true",
                       help="spawn a replacement for every rank lost, keeping the job's size")
    group.add_argument("--accept-server-loss", action="store_true",
                       help="--mode ps --ft with one server and no --checkpoint-dir: run anyway, knowing "
                            "that the server's death ends the job (a worker's death is still recovered)")
    group.add_argument("--checkpoint-dir", metavar="DIR",
                       help="write checkpoints here and resume from the latest one at start")
    group.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                       help="checkpoint every STEPS steps (needs --checkpoint-dir)")
    group.add_argument("--slow", action="append", default=[], metavar="RANK:FACTOR",
                       help="straggler injection: rank RANK's compute takes FACTOR (>= 1) times as long; "
                            "repeatable")
    group.add_argument("--deadline", dest="deadline_s", type=float, metavar="SECONDS",
                       help="abort the job when a blocking wait lasts longer (a hung peer; "
                            "default: HPCREDUCE_DEADLINE, else 120)")


def fault_config(args: argparse.Namespace) -> Tuple[FaultConfig, List[str]]:
    """The FaultConfig the flags ask for, and the flags that do not parse."""
    problems: List[str] = []
    kills, grow, grow_servers, leave, slow, node_kills = [], [], [], [], [], []
    for flag, texts, parse, into in (("--kill", args.kills, parse_kill, kills), ("--grow", args.grow, parse_grow, grow),
                                     ("--grow-servers", args.grow_servers, parse_grow, grow_servers),
                                     ("--leave", args.leave, parse_leave, leave),
                                     ("--slow", args.slow, parse_slow, slow),
                                     ("--kill-node", args.node_kills, parse_kill_node, node_kills)):
        for text in texts:
            try:
                into.append(parse(text))
            except ValueError as err:
                problems.append(f"{flag} {err}")
    config = FaultConfig(kills=kills, kill_random=args.kill_random, kill_seed=args.kill_seed, grow=grow, grow_servers=grow_servers,
                         leave=leave, hostfile=getattr(args, "hostfile", None), discover=args.discover,
                         discover_every=args.discover_every, replace=args.replace,
                         checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                         deadline_s=args.deadline_s, slow=slow, accept_server_loss=args.accept_server_loss,
                         node_kills=node_kills)
    return config, problems
