"""``ZeroRedundancyOptimizer`` under ``hpcreduce.elastic.State``: a sharded state that survives a
SIGKILL in place.

At each commit (``shard_snapshot``, collective) a rank keeps a copy of its part of the state
(its slices' optimizer state, with the optimizer's step count as version) and of its ring
neighbour's: rank r sends its part to rank r+1 (a small pickled header, then the tensors as one
raw buffer), so every part lives on two ranks. After a failure every survivor puts back its
last commit (``restore_point``); after a failure or a growth (``reshard``, collective, on the
ranks there are now, newcomers included) the ranks gather those parts (one allgather, only
then), rebuild the whole state from the survivors' own parts and, for a lost rank, from its
neighbour's copy, and each keeps its slices among the new number of ranks. After a full state
was loaded on one rank (``load_checkpoint`` loads on rank 0, then syncs), that state is everyone's. A lost part with no
copy (two neighbours lost together) or parts of different versions (a failure during a
commit's copy) raise ``InputMismatchError`` on every rank: never a silently wrong state.
``assemble`` puts slices' states together as the whole (here, and in ``consolidate_state_dict``).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from ..errors import InputMismatchError
from ..ft.watchdog import watchdog
from ..runtime.context import Context, resolve

Part = Dict[str, Any]
"""{"version", "rank", "size", "pieces": [(parameter index, a, b, {state key: value})], "groups": the
parameter groups' hyperparameters (a newcomer's are its own until it takes these)}."""


def local_part(zero: Any) -> Part:
    """This rank's slices' optimizer state (cloned), with its version, rank and number of ranks."""
    local = zero.optim.state_dict()["state"]
    pieces = [(*zero.slices[i], {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                                 for k, v in state.items()})
              for i, state in local.items() if i < len(zero.slices)]
    return {"version": zero.steps, "rank": zero.rank, "size": zero.size, "pieces": pieces,
            "groups": zero.indexed_groups()}


def pack(part: Part, dtype: torch.dtype) -> Tuple[Part, torch.Tensor]:
    """``part`` as a header (shapes, no tensors) and its tensors end to end in one flat buffer."""
    flat: List[torch.Tensor] = []
    pieces = []
    for index, a, b, values in part["pieces"]:
        shapes = {}
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                shapes[key] = (tuple(value.shape), str(value.dtype).replace("torch.", ""))
                flat.append(value.reshape(-1).to(dtype))
            else:
                shapes[key] = (None, value)
        pieces.append((index, a, b, shapes))
    return {**part, "pieces": pieces}, torch.cat(flat) if flat else torch.zeros(0, dtype=dtype)


def unpack(header: Part, flat: torch.Tensor) -> Part:
    """``pack``'s header and buffer as the part again."""
    pieces, offset = [], 0
    for index, a, b, shapes in header["pieces"]:
        values = {}
        for key, (shape, scalar_or_dtype) in shapes.items():
            if shape is None:
                values[key] = scalar_or_dtype
                continue
            count = int(torch.Size(shape).numel())
            values[key] = flat[offset:offset + count].to(getattr(torch, scalar_or_dtype)).reshape(shape).clone()
            offset += count
        pieces.append((index, a, b, values))
    return {**header, "pieces": pieces}


def shard_snapshot(zero: Any) -> Optional[Dict[str, Optional[Part]]]:
    """What a commit keeps: this rank's part and its left neighbour's (collective among the
    members; None, with no communication, on a rank spawned into the job and not yet synced)."""
    if not zero.member:
        return None
    mine = local_part(zero)
    if zero.size == 1:
        return {"mine": mine, "left": None}
    comm = resolve(zero.process_group).comm
    right, left = (zero.rank + 1) % zero.size, (zero.rank - 1) % zero.size
    header, flat = pack(mine, zero.params[0].dtype)
    with watchdog.guard("ZeroRedundancyOptimizer's commit: its part to the ring neighbour"):
        theirs = comm.sendrecv(header, dest=right, source=left)
        count = sum(int(torch.Size(shape).numel()) for _, _, _, shapes in theirs["pieces"]
                    for shape, _ in shapes.values() if shape is not None)
        received = torch.empty(count, dtype=flat.dtype)
        comm.Sendrecv(flat.numpy(), dest=right, recvbuf=received.numpy(), source=left)
    return {"mine": mine, "left": unpack(theirs, received)}


def reshard(zero: Any, context: Context) -> None:
    """Rebuild the whole state from every rank's kept parts and keep this rank's new slices
    (collective over ``context``; see the module docstring)."""
    kept = zero.restore_point if zero.restore_point is not None else (
        {"mine": local_part(zero), "left": None} if zero.member else None)
    with watchdog.guard("ZeroRedundancyOptimizer's re-shard: every rank's kept parts"):
        contributions = context.comm.allgather((kept, zero.loaded))
    loaded = next((full for _, full in contributions if full is not None), None)
    if loaded is not None:  # a checkpoint loaded on rank 0 (load_checkpoint): its whole state, everywhere
        zero.reshard_to(context.rank, context.size)
        zero.load_state_dict(loaded)
        zero.restore_point, zero.member, zero.loaded = None, True, None
        return
    gathered = [found for found, _ in contributions if found is not None]
    parts: Dict[int, Part] = {}
    for found in gathered:
        parts[found["mine"]["rank"]] = found["mine"]
    for found in gathered:
        if found["left"] is not None:
            parts.setdefault(found["left"]["rank"], found["left"])
    old_size = gathered[0]["mine"]["size"] if gathered else 0
    missing = [rank for rank in range(old_size) if rank not in parts]
    versions = sorted({part["version"] for part in parts.values()})
    if not gathered or missing or len(versions) > 1:
        raise InputMismatchError(
            "ZeroRedundancyOptimizer: the sharded optimizer state cannot be rebuilt: "
            + (f"the parts of old ranks {missing} are lost with no copy (neighbours lost together)" if missing
               else f"its parts are of different steps {versions} (a failure during a commit's copy)"
               if gathered else "no rank holds a part"))
    pieces = [piece for part in parts.values() for piece in part["pieces"]]
    full = {"state": assemble(zero.params, pieces), "param_groups": parts[min(parts)]["groups"]}
    zero.reshard_to(context.rank, context.size)
    zero.load_state_dict(full)
    zero.steps, zero.restore_point, zero.member, zero.loaded = versions[0], None, True, None


def assemble(params: List[torch.Tensor], pieces: Iterable[Tuple[int, int, int, Dict[str, Any]]]) -> Dict[int, Any]:
    """The full state by parameter index from slices' states ``(index, a, b, values)``: each
    elementwise tensor placed at its slice, other values (``step``) taken as they are."""
    state: Dict[int, Dict[str, Any]] = {}
    for index, a, b, values in pieces:
        param = params[index]
        into = state.setdefault(index, {})
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and key != "step" and value.dim() == 1 and value.numel() == b - a:
                into.setdefault(key, torch.zeros(param.numel(), dtype=value.dtype)).view(-1)[a:b] = value.cpu()
            else:
                into[key] = value
    for index, values in state.items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and key != "step" and value.numel() == params[index].numel():
                values[key] = value.view_as(params[index])
    return state
