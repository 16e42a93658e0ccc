"""``ZeroRedundancyOptimizer``: torch's sharded optimizer (ZeRO-1) over MPI ranks.

    model = hpcreduce.torch.DistributedDataParallel(model)
    optimizer = hpcreduce.torch.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)

The parameters, taken end to end as one flat vector, are cut into N near-equal slices
(``ring.chunk_bounds``: a parameter may straddle two ranks); rank r keeps the optimizer state
of slice r only. ``step()`` hands each of its slices the reduced gradient's slice (a view),
steps its local optimizer (``.optim``, ``optimizer_class`` over the slices, views of the
parameters' memory where contiguous, so stepped in place; with the same hyperparameters, kept in
step with ``param_groups`` so schedulers work) and gathers every rank's updated slice
(``collectives.allgatherv``; ZeRO-2 over a wrapper's buckets: ``zero_grads``); under ULFM the
gather is agreed (``elastic.agreement.agreed``: one ``MPI_Comm_agree``) before the step returns, as
a gather may complete on a survivor although a peer died in it, and a step some rank did not finish
must be committed nowhere. So optimizer state per rank is about 1/N of the unsharded one.
``add_param_group`` (collective) re-partitions, the state kept. Only optimizers whose step is elementwise can be
sliced (``ELEMENTWISE``); others (L-BFGS...) are refused on every rank at construction, as are
parameter groups that differ between ranks. ``consolidate_state_dict(to)`` gathers the full
state to one rank, whose ``state_dict()`` then reads as the unsharded optimizer's;
``load_state_dict`` takes such a full state on every rank and keeps its own slices, at any
number of ranks; ``full_state_dict()`` (collective) gives the full state on every rank, for a
checkpoint written at N ranks and loaded at M.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from mpi4py import MPI

from ..collectives import allgatherv
from ..collectives.ring import chunk_bounds
from ..collectives.validate import InputProblem, ProblemKind, agree, raise_local, stable_hash
from ..elastic.agreement import agreed
from ..errors import InputMismatchError, UnsupportedInputError
from ..ft.watchdog import watchdog
from ..runtime.context import Comm, Context, resolve
from . import zero_elastic, zero_grads
from .views import array_view, write_elements

ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop,
               torch.optim.Adamax)
"""Optimizers whose step treats every element on its own (so a slice steps as the whole would)."""

Slice = Tuple[int, int, int]
"""(parameter index, first element, end element) of one rank's slice of a parameter."""


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """``optimizer_class(params, **defaults)`` with its state sharded over the ranks of
    ``process_group`` (None: the default context; a Context or an MPI intracommunicator).
    Collective construction. ``parameters_as_bucket_view`` is accepted (parameters are always
    gathered through one flat buffer); ``overlap_with_ddp=True`` is not supported."""

    def __init__(self, params: Iterable[Any], optimizer_class: type, process_group: Comm = None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False, **defaults: Any):
        context = resolve(process_group)
        groups = _groups(params)
        flat_params = [p for group in groups for p in group["params"]]
        problem = _problem(optimizer_class, flat_params, overlap_with_ddp)
        reducer = zero_grads.reducer_of(flat_params, context) if problem is None else None
        layout = [[(tuple(p.shape), str(p.dtype)) for p in group["params"]] for group in groups]
        hyper = [{k: v for k, v in group.items() if k != "params"} for group in groups]
        name = getattr(optimizer_class, "__qualname__", repr(optimizer_class))
        stage = 1 if reducer is None else 2
        fields = [("optimizer_class", stable_hash(name), name),
                  ("parameter groups (shapes, dtypes)", stable_hash(layout), lambda: layout),
                  ("hyperparameters", stable_hash(repr(hyper)), lambda: hyper),
                  ("stage (2: over one DistributedDataParallel's parameters)", stage, stage)]
        if context.joined:
            raise_local("ZeroRedundancyOptimizer", problem, context.rank)
        else:
            with watchdog.guard("ZeroRedundancyOptimizer's construction (every rank makes it)"):
                agree(context, "ZeroRedundancyOptimizer", fields, problem)
        super().__init__(groups, defaults)  # only once every rank agreed: nothing changes before
        self.process_group = process_group
        self.rank, self.size = context.rank, context.size
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self.params: List[torch.Tensor] = [p for group in self.param_groups for p in group["params"]]
        self.grads: Optional[zero_grads.GradientShards] = None
        self.places: List[zero_grads.Place] = []
        if reducer is not None:
            self.grads = zero_grads.attach(self, reducer)
        self.stage = stage
        self.optimizer_class, self.local_defaults = optimizer_class, defaults
        self.steps = 0
        self.restore_point: Optional[Dict[str, Any]] = None  # an elastic commit's parts, until re-sharded
        self.member = not context.joined  # a rank spawned into an elastic job holds no part yet
        self.loaded: Optional[Dict[str, Any]] = None  # a full state loaded here since the last step
        self._full: Optional[Dict[str, Any]] = None
        self.reshard_to(self.rank, self.size)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's: once constructed, collective (every rank adds the same group, else every rank
        raises): the parameters are re-partitioned over the ranks, the state kept (the whole state
        gathered, then re-sharded). Refused on every rank under ZeRO-2 (the optimizer holds its
        wrapper's parameters, no other) and for parameters in a group already."""
        if not hasattr(self, "optim"):  # torch's Optimizer.__init__ adding the first groups
            super().add_param_group(param_group)
            return
        context = resolve(self.process_group)
        group = _groups([param_group])[0]
        params = group["params"]
        problem = _problem(self.optimizer_class, self.params + params, False)
        reasons = [problem.detail] if problem is not None else []
        if self.grads is not None:
            reasons.append("under ZeRO-2 it holds exactly its DistributedDataParallel's parameters "
                           "(add the group before making it, or wrap the whole model)")
        if {id(p) for p in params} & {id(p) for p in self.params}:
            reasons.append("some parameters are in a group already")
        layout = [(tuple(p.shape), str(p.dtype)) for p in params]
        hyper = {k: v for k, v in group.items() if k != "params"}
        with watchdog.guard("ZeroRedundancyOptimizer.add_param_group's agreement (every rank adds the group)"):
            agree(context, "ZeroRedundancyOptimizer.add_param_group",
                  [("the group's parameters (shapes, dtypes)", stable_hash(layout), lambda: layout),
                   ("the group's hyperparameters", stable_hash(repr(hyper)), lambda: hyper)],
                  InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(reasons)) if reasons else None)
        full = self.full_state_dict()
        super().add_param_group(group)
        self.params = [p for group in self.param_groups for p in group["params"]]
        self.reshard_to(self.rank, self.size)  # the old parameters keep their indices: theirs come first
        self.load_state_dict({"state": full["state"],
                              "param_groups": full["param_groups"] + self.indexed_groups()[-1:]})

    def reshard_to(self, rank: int, size: int) -> None:
        """This rank's slices among ``size`` ranks, their copies and a new local optimizer."""
        self.rank, self.size = rank, size
        self.bounds = chunk_bounds(sum(p.numel() for p in self.params), size)
        if self.grads is not None:  # in bucket order: put group by group, as the local optimizer numbers them
            slices, places = self.grads.owned(self.params, rank, size)
            group_of = {i: g for g, group in enumerate(self.indexed_groups()) for i in group["params"]}
            order = sorted(range(len(slices)), key=lambda position: group_of[slices[position][0]])
            self.slices, self.places = [slices[p] for p in order], [places[p] for p in order]
        else:
            self.slices = owned(self.params, self.bounds[rank], self.bounds[rank + 1])
        self.shards = [_slice_of(self.params[i], a, b) for i, a, b in self.slices]
        self.copies = [position for position, (i, _, _) in enumerate(self.slices)
                       if not self.params[i].is_contiguous()]  # the shards that are not views
        self.optim = self.optimizer_class(self._local_groups(), **self.local_defaults)
        for ours, theirs in zip(self.param_groups, self.optim.param_groups):  # the class's defaults, as torch's
            for key, value in theirs.items():
                if key != "params":
                    ours.setdefault(key, value)

    def _local_groups(self) -> List[Dict[str, Any]]:
        """The local optimizer's groups: each of ours over the shards of its parameters."""
        group_of = {id(p): g for g, group in enumerate(self.param_groups) for p in group["params"]}
        groups: List[Dict[str, Any]] = [{**{k: v for k, v in group.items() if k != "params"}, "params": []}
                                        for group in self.param_groups]
        for (index, _, _), shard in zip(self.slices, self.shards):
            groups[group_of[id(self.params[index])]]["params"].append(shard)
        if not self.shards:  # fewer elements than ranks: an empty shard keeps the optimizer valid
            groups[0]["params"].append(torch.zeros(0, dtype=self.params[0].dtype, device=self.params[0].device))
        return groups

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step this rank's slices on their gradients' slices, then gather every rank's slices."""
        if resolve(self.process_group).size != self.size:
            raise UnsupportedInputError(
                f"ZeroRedundancyOptimizer.step: the job went from {self.size} to "
                f"{resolve(self.process_group).size} ranks without a re-shard (elastic.State re-shards after a "
                f"failure, a growth or a leave)")
        self.loaded = None
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for ours, theirs in zip(self.param_groups, self.optim.param_groups):
            theirs.update({k: v for k, v in ours.items() if k != "params"})
        for position in self.copies:  # the others are views: the parameters' current values
            index, a, b = self.slices[position]
            self.shards[position].copy_(self.params[index].detach().reshape(-1)[a:b])
        for position, ((index, a, b), shard) in enumerate(zip(self.slices, self.shards)):
            param = self.params[index]
            if self.grads is not None:  # ZeRO-2: the slice's reduced gradient, kept by the reducer
                shard.grad = self.grads.gradient(self.places[position], b - a) \
                    if id(param) in self.grads.reduced else None
            else:
                shard.grad = None if param.grad is None else param.grad.reshape(-1)[a:b]
        self.optim.step()  # this rank's slices of the parameters in place (or their copies)
        self.steps += 1
        for position in self.copies:
            index, a, b = self.slices[position]
            write_elements(self.params[index], a, b, self.shards[position])
        if self.grads is not None:
            self.grads.reduced = set()  # a step consumes them: a second one without backward steps on none
        # under ULFM a gather can complete on a survivor although a peer died in it: the step is
        # agreed before anyone goes on, else every rank raises Interrupted (elastic.run recovers)
        agreed(resolve(self.process_group), self._gather, f"ZeroRedundancyOptimizer.step {self.steps}: the gather")
        return loss

    def _gather(self) -> None:
        """Every rank's updated slices into every rank's parameters (ZeRO-1: one ``allgatherv`` of
        this rank's slices, which stages device memory through the host where MPI needs it)."""
        if self.grads is not None:
            self.grads.gather(self.places, self.shards)
            return
        if self.size == 1:
            return
        mine = torch.cat(self.shards) if self.shards else self.params[0].detach().new_empty(0)
        gathered = torch.as_tensor(allgatherv(array_view(mine)[0], comm=resolve(self.process_group)))
        offset = 0
        for param in self.params:
            write_elements(param, 0, param.numel(), gathered[offset:offset + param.numel()])
            offset += param.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for shard in self.shards:
            shard.grad = None

    def shard_snapshot(self) -> Dict[str, Any]:
        """What an ``elastic.State`` commit keeps: this rank's part and its ring neighbour's
        (collective; ``zero_elastic``)."""
        return zero_elastic.shard_snapshot(self)

    def reshard(self, context: Context) -> None:
        """After a failure or a growth: the whole state from every rank's kept parts, re-sharded
        over ``context``'s ranks (collective; ``zero_elastic``)."""
        zero_elastic.reshard(self, context)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        return sum(v.numel() * v.element_size() for state in self.optim.state.values()
                   for v in state.values() if isinstance(v, torch.Tensor))

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the full optimizer state on rank ``to`` (collective), for its ``state_dict()``."""
        local = self.optim.state_dict()["state"]
        mine = {self.slices[i][0]: (self.slices[i][1], self.slices[i][2],
                                    {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
                for i, state in local.items() if i < len(self.slices)}
        with watchdog.guard(f"ZeroRedundancyOptimizer.consolidate_state_dict(to={to}) (every rank calls it)"):
            gathered = resolve(self.process_group).comm.gather(mine, root=to)
        if self.rank != to:
            self._full = None
            return
        pieces = [(index, a, b, values) for part in gathered for index, (a, b, values) in part.items()]
        self._full = {"state": zero_elastic.assemble(self.params, pieces), "param_groups": self.indexed_groups()}

    def full_state_dict(self) -> Dict[str, Any]:
        """The full state on every rank (collective: ``consolidate_state_dict`` to rank 0, then one
        broadcast): what a checkpoint stores, loadable by ``load_state_dict`` at any number of ranks."""
        try:
            self.consolidate_state_dict(to=0)
            problem = None
        except MPI.Exception:
            raise
        except (RuntimeError, ValueError, KeyError, IndexError) as err:  # assembling it, on rank 0 only
            problem = f"{type(err).__name__}: {err}"
        with watchdog.guard("ZeroRedundancyOptimizer.full_state_dict (every rank calls it)"):
            full, problem = resolve(self.process_group).comm.bcast((self._full, problem) if self.rank == 0 else None)
        self._full = None
        if problem is not None:  # the same error on every rank, none left waiting
            raise InputMismatchError(f"ZeroRedundancyOptimizer.full_state_dict: rank 0 could not assemble the "
                                     f"whole state: {problem}")
        return full

    def indexed_groups(self) -> List[Dict[str, Any]]:
        position = {id(p): i for i, p in enumerate(self.params)}
        return [{**{k: v for k, v in group.items() if k != "params"},
                 "params": [position[id(p)] for p in group["params"]]} for group in self.param_groups]

    def state_dict(self) -> Dict[str, Any]:
        """The full state (as the unsharded optimizer's ``state_dict``), on the rank that
        ``consolidate_state_dict`` gathered it to; elsewhere a RuntimeError, as torch's."""
        if self._full is None:
            raise RuntimeError("ZeroRedundancyOptimizer.state_dict(): call consolidate_state_dict(to=this rank) "
                               "first, on every rank")
        return self._full

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Take a full state (``state_dict()``'s, or the unsharded optimizer's) and keep this
        rank's slices of it; the hyperparameters of its groups become ours."""
        self.loaded = state_dict
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(len(g["params"]) != len(o["params"])
                                                        for g, o in zip(groups, self.param_groups)):
            raise UnsupportedInputError("ZeroRedundancyOptimizer.load_state_dict: the state's parameter groups "
                                        "differ from this optimizer's")
        for ours, theirs in zip(self.param_groups, groups):
            ours.update({k: v for k, v in theirs.items() if k != "params"})
        local_groups = self._local_groups()
        local: Dict[int, Dict[str, Any]] = {}
        for position, (index, a, b) in enumerate(self.slices):
            values = state_dict["state"].get(index)
            if values is not None:
                local[position] = {k: v.reshape(-1)[a:b].clone() if isinstance(v, torch.Tensor) and k != "step"
                                   and v.numel() == self.params[index].numel() else v for k, v in values.items()}
        offset, indexed = 0, []
        for group in local_groups:
            count = len(group["params"])
            indexed.append({**{k: v for k, v in group.items() if k != "params"},
                            "params": list(range(offset, offset + count))})
            offset += count
        self.optim.load_state_dict({"state": local, "param_groups": indexed})


def owned(params: List[torch.Tensor], begin: int, end: int) -> List[Slice]:
    """The slices of ``params`` (end to end) that fall in ``[begin, end)``."""
    slices, offset = [], 0
    for index, param in enumerate(params):
        a, b = max(begin, offset), min(end, offset + param.numel())
        if a < b:
            slices.append((index, a - offset, b - offset))
        offset += param.numel()
    return slices


def _slice_of(param: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Elements ``[a, b)`` of ``param``: a view of its memory where it is contiguous (the local
    optimizer then steps the parameter in place), else a copy."""
    values = param.detach()
    return values.view(-1)[a:b] if values.is_contiguous() else values.reshape(-1)[a:b].clone()


def _groups(params: Iterable[Any]) -> List[Dict[str, Any]]:
    """``params`` as torch's optimizer takes it: parameter groups (dicts, their params a list)."""
    items = list(params)
    if items and isinstance(items[0], dict):
        return [{**group, "params": [group["params"]] if isinstance(group["params"], torch.Tensor)
                 else list(group["params"])} for group in items]
    return [{"params": items}]


def _problem(optimizer_class: Any, params: List[torch.Tensor], overlap_with_ddp: bool) -> Optional[InputProblem]:
    """What this rank cannot shard: a non-elementwise optimizer, mixed dtypes or devices, overlap."""
    reasons = [] if params else ["it got an empty parameter list"]
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, ELEMENTWISE)):
        reasons.append(f"optimizer_class {getattr(optimizer_class, '__name__', optimizer_class)!r} does not step "
                       f"element by element, so its state cannot be sliced (supported: "
                       f"{', '.join(c.__name__ for c in ELEMENTWISE)})")
    if len({(p.dtype, p.device) for p in params}) > 1:
        reasons.append("the parameters are of several dtypes or devices (one of each is supported)")
    if params and params[0].dtype not in (torch.float32, torch.float64):
        reasons.append(f"the parameters are {params[0].dtype} (float32 or float64 are supported)")
    if overlap_with_ddp:
        reasons.append("overlap_with_ddp=True is not supported (the step runs after backward)")
    return InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(reasons)) if reasons else None
