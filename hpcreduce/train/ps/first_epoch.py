"""How a rank of a fault-tolerant PS run gets its first epoch: the ranks the job started with
make the initial roles together (``ps.roles``: servers on ranks 0..K-1 with their shard and its
neighbour's replica, the replication ring across nodes); a rank spawned into a running job
takes what the job's ``Welcome`` says (``ps_growth.join``). A job started again over its own
checkpoint folder makes its shards from the latest complete checkpoint (``resume_point``)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ...ft.membership import Membership
from ...ft.watchdog import watchdog
from ...ps.holdings import ShardHoldings
from ...ps.roles import initial_layout, make_role
from ...ps.server import Server
from ...ps.worker import Worker
from ...runtime.context import Context
from ...runtime.failures import fatal_failures
from ...runtime.nodes import rank_nodes
from .epoch import Epoch, Welcome
from .final import initial_shards
from .loop import WorkerLoop
from .ps_growth import join
from .ps_setup import PSSetup
from .resume_point import Resume
from .worker_side import WorkerSide

Progress = Callable[[Server, int], None]


def founding_epoch(ctx: Context, setup: PSSetup, new_loop: Callable[[Worker], WorkerLoop], on_progress: Progress,
                   echo: Callable[[str], None],
                   resume: Resume = Resume(None)) -> Tuple[Epoch, Optional[Server], List[Dict[str, Any]]]:
    """Collective over the job's ranks: the first epoch, this rank's server (None on a worker)
    and where each shard lives (``Layout.homes``, for the results); the shards (and replicas)
    from ``resume``'s checkpoint when it has one, every worker at its ``first_step``."""
    tables = setup.tables
    nodes = rank_nodes(ctx.comm)
    layout = initial_layout(ctx, tables, setup.ps.servers, nodes, replicated=True)
    if layout.same_node_backups():
        echo(f"ps: shard(s) {layout.same_node_backups()} keep their replica on their own node (it holds more "
             "than half the servers): losing that node loses them, unless --checkpoint-dir has them")
    made: List[Any] = []  # the shard states made here: this server's own, then its replica

    def shards(key: int) -> List[Any]:
        keys = [key, layout.neighbours(key)[1]] if len(layout.shard_ranks) > 1 else [key]
        made.extend([resume.shard(setup, layout, k) for k in keys] if resume.point else
                    initial_shards(setup, layout, keys))
        return made
    role = make_role(ctx, layout, tables, shards, guard=watchdog.guard, on_progress=on_progress,
                     clock=resume.first_step)
    members = Membership.founding(ctx.size, ctx.rank)
    epoch = Epoch(ctx.comm, layout, members, setup.ps.servers, nodes=dict(zip(members.ids, nodes)))
    homes = layout.homes(nodes, replicated=True)
    if isinstance(role, Worker):
        return epoch.but(worker=WorkerSide(new_loop(role))), None, homes
    holdings = ShardHoldings.serving(role.state.shard, made[0], made[1] if len(made) > 1 else None)
    return epoch.but(holdings=holdings), role, homes


def newcomer_epoch(ctx: Context, setup: PSSetup, new_loop: Callable[[Worker], WorkerLoop]) -> Tuple[Epoch, Welcome]:
    """A rank spawned into the running job: its first epoch, from the ``Welcome`` rank 0
    broadcasts (returned too: its clock is where the newcomer's steps start)."""
    with fatal_failures("a newcomer's start (the welcome)", lambda: ctx.comm):
        welcome = ctx.comm.bcast(None, root=0)
    return join(ctx, setup, welcome, new_loop), welcome
