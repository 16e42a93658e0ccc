"""``DistributedDataParallel``: torch DDP's interface over MPI ranks, reductions overlapping backward.

    model = hpcreduce.torch.DistributedDataParallel(model)     # rank 0's weights everywhere
    for x, y in shard:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()                       # gradients averaged when it returns
        optimizer.step()

Construction (collective): every rank's parameters must bucket the same way (names, shapes,
dtypes, bucket size, compression), else every rank raises ``InputMismatchError`` naming the
first difference; then rank 0's parameters and buffers are broadcast. A rank spawned into a
running elastic job (``context.joined``) skips both: the job's ``elastic.State`` sync gives
it the values, and a collective of its own would wait for ranks that are not in it. Every
argument is checked into that same cross-rank check: a bad one on one rank raises on all.
How a bucket is reduced is its comm hook's (``register_comm_hook``, torch's signature;
``hooks``): the mean through ``hpcreduce.collectives`` by default.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from numbers import Real
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

from ..collectives.broadcast import broadcast_tensor
from ..collectives.validate import InputProblem, ProblemKind, agree, raise_local, stable_hash
from ..ft.watchdog import watchdog
from ..runtime.context import Comm, resolve
from .buckets import build, layout
from .dtypes import REDUCIBLE
from .parameters import broadcast_parameters
from .hooks.default import bf16_compress_hook, fp16_compress_hook
from .hooks.agreement import hook_name
from .reducer import Hook, Reducer

DEFAULT_BUCKET_CAP_MB = 25.0
MAX_BUCKET_CAP_MB = float(2 ** 20)
"""The largest ``bucket_cap_mb`` taken (1 TiB)."""
COMPRESSIONS = {"bf16": bf16_compress_hook, "fp16": fp16_compress_hook}


class DistributedDataParallel(torch.nn.Module):
    """Wrap ``module`` for data-parallel training over the ranks of ``process_group`` (torch's
    signature; None: the default context, whose communicator a recovery swaps underneath; a
    Context or an MPI intracommunicator; ``comm`` is its older alias, one of the two at most).

    ``device_ids``/``output_device``: None, or the one device the module's parameters are on
    (the module is not moved); ``dim`` and ``find_unused_parameters`` are accepted (unused
    parameters are always found: one small allreduce a step); ``init_sync=False``: no broadcast
    of rank 0's parameters at construction.
    ``bucket_cap_mb``: the most bytes of gradients per bucket (None: 25); ``compression``: None, "bf16"
    or "fp16" (``bf16_compress_hook``/``fp16_compress_hook``: float32 gradients travel as 16
    bits, sums in float32; bfloat16 and float16 gradients always do); ``check_finite``: raise ``TrainingError`` on every rank when a
    reduced gradient holds a NaN or an Inf (one summing pass per bucket; pass False under
    loss scaling); ``overlap``: reduce on a thread while backward goes on (needs
    ``MPI_THREAD_MULTIPLE``; else, or False, at the end of backward; None: on a thread for
    GPU buckets, or when the rank has a core more than torch's threads); ``broadcast_buffers``:
    rank 0's buffers before every forward, as DDP does."""

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Any = None, dim: int = 0, broadcast_buffers: bool = True, init_sync: bool = True,
                 process_group: Comm = None, bucket_cap_mb: Optional[float] = None,
                 find_unused_parameters: bool = False, *, comm: Comm = None, compression: Optional[str] = None,
                 check_finite: bool = True, overlap: Optional[bool] = None):
        super().__init__()
        self.module = module
        group = process_group if comm is None else comm
        context = resolve(group)
        is_module = isinstance(module, torch.nn.Module)
        named = [(name, param) for name, param in module.named_parameters() if param.requires_grad] \
            if is_module else []
        flags = {"check_finite": check_finite, "broadcast_buffers": broadcast_buffers, "init_sync": init_sync,
                 "find_unused_parameters": find_unused_parameters}
        cap, problem = _problem(module if is_module else torch.nn.Module(), named,
                                DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb, compression,
                                flags, overlap, _device_problems(named, device_ids, output_device, dim,
                                                                 process_group, comm))
        buckets = layout(named, cap)
        settings = [cap, compression, check_finite, broadcast_buffers, init_sync]
        if context.joined:
            raise_local("DistributedDataParallel", problem, context.rank)
        else:
            with watchdog.guard("DistributedDataParallel's construction (every rank wraps the same module)"):
                agree(context, "DistributedDataParallel",
                      [("buckets", stable_hash(buckets), lambda: buckets),
                       ("bucket_cap_mb, compression, check_finite, broadcast_buffers, init_sync",
                        stable_hash(repr(settings)), lambda: settings)],
                      problem)
                if init_sync:
                    broadcast_parameters(module, comm=context)
        self.comm = self.process_group = group
        self.broadcast_buffers = broadcast_buffers and any(True for _ in module.buffers())
        self._named = named
        self._shapes = [param.shape for _, param in named]
        self._slots = _slots(module, named) if is_module else []
        self.reducer = Reducer(build(named, cap), comm=group, check_finite=check_finite, overlap=overlap)
        self._hook_from = f"compression={compression!r}" if compression else None
        if compression:
            self.reducer.hook = COMPRESSIONS[compression]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.reducer.running:  # the last backward raised before its end: its gradients are not reduced
            self.reducer.abandon()
        self._check_parameters()
        if self.broadcast_buffers and self.reducer.syncing:
            context = resolve(self.comm)
            with torch.no_grad(), watchdog.guard("the broadcast of rank 0's buffers before forward"):
                for buffer in self.module.buffers():
                    broadcast_tensor(context, buffer, 0)
        return self.module(*args, **kwargs)

    def revoke(self) -> None:
        """Revoke the library's own communicator (a failure seen elsewhere, as by a hybrid job's
        tables): a peer blocked in a reduction leaves it; after a recovery the next reduction
        duplicates the new communicator."""
        self.reducer.revoke()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate gradients in place without reducing them; the first
        backward after it reduces what accumulated."""
        before, self.reducer.syncing = self.reducer.syncing, False
        try:
            yield
        finally:
            self.reducer.syncing = before

    def register_comm_hook(self, state: object, hook: Hook) -> None:
        """Reduce every bucket with ``hook(state, bucket)`` from the next backward on (torch's
        signature: ``hooks.GradBucket`` in, a ``torch.futures.Future`` of the reduced flat
        tensor out; ``hooks`` has torch's built-ins). Collective: every rank registers the same
        hook (by qualified name) and kind of state, else every rank raises, a rank that registers
        alone included (its check meets its peers' next backward: ``hooks.agreement``). Once per
        wrapper. After the ranks change, a state with ``state_dict``/``load_state_dict`` takes rank 0's."""
        context = resolve(self.comm)
        reasons = []
        if not callable(hook):
            reasons.append(f"hook is a {type(hook).__name__}, not a function hook(state, bucket)")
        if self._hook_from is not None:
            reasons.append(f"a comm hook is registered already ({self._hook_from}); torch allows one")
        if self.reducer.running:
            reasons.append("it was called during backward")
        if self.reducer.shards is not None:
            reasons.append("a ZeroRedundancyOptimizer reduce-scatters this wrapper's gradients (ZeRO-2); "
                           "register the hook before making it")
        problem = InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(reasons)) if reasons else None
        if context.joined:  # a spawned rank: its hook is checked with its peers' at its first backward
            raise_local("DistributedDataParallel.register_comm_hook", problem, context.rank)
        else:
            self.reducer.agree_hook(hook, state, problem)
        self.reducer.hook, self.reducer.state = hook, state
        self._hook_from = f"register_comm_hook({hook_name(hook)})"

    def wire_bytes(self) -> int:
        """Bytes this rank sent in the last synchronised step (all buckets, through the hook;
        0 before the first)."""
        return self.reducer.sent_last_step

    def _check_parameters(self) -> None:
        """A parameter replaced or reshaped since wrapping goes to the reduction as NaN (every rank
        stops). Every forward: each submodule and parameter still where it was (``_slots``: a
        dictionary lookup each, not a walk of the module tree) and of its shape."""
        if all(held.get(key) is value for held, key, value in self._slots) \
                and all(param.shape == shape for (_, param), shape in zip(self._named, self._shapes)):
            return
        for (name, then), shape in zip(self._named, self._shapes):
            owner, _, leaf = name.rpartition(".")
            now = getattr(self.module.get_submodule(owner) if owner else self.module, leaf, None)
            if now is not then or now.shape != shape:
                self.reducer.note_problem(name, "it was replaced or changed shape after wrapping "
                                                "(wrap the module after its last change)")


def _slots(module: torch.nn.Module, named: List[Tuple[str, torch.nn.Parameter]]) -> List[Tuple[dict, str, object]]:
    """Where each wrapped parameter and each submodule on the way to it is held: (the holder's
    ``_modules`` or ``_parameters``, the key, what was there at wrapping)."""
    slots = {}
    for name, param in named:
        *path, leaf = name.split(".")
        holder = module
        for key in path:
            child = holder._modules[key]
            slots[(id(holder), key)] = (holder._modules, key, child)
            holder = child
        slots[(id(holder), leaf)] = (holder._parameters, leaf, param)
    return list(slots.values())


def _device_problems(named: List[Tuple[str, torch.nn.Parameter]], device_ids: object, output_device: object,
                     dim: object, process_group: Comm, comm: Comm) -> List[str]:
    """What torch's arguments ask that this wrapper does not do: several devices, a device the
    parameters are not on, a non-integer ``dim``, both ``process_group`` and ``comm``."""
    reasons = ["process_group and comm are both given (comm is process_group's older name: pass one)"] \
        if process_group is not None and comm is not None else []
    if isinstance(dim, bool) or not isinstance(dim, int):
        reasons.append(f"dim must be an int, got {dim!r}")
    devices = {str(param.device) for _, param in named}
    wanted = [] if device_ids is None else list(device_ids) if isinstance(device_ids, (list, tuple)) else None
    if wanted is None or len(wanted) > 1:
        reasons.append(f"device_ids must be None or one device (the module's), got {device_ids!r}")
    for device in (wanted or []) + ([] if output_device is None else [output_device]):
        try:
            name = str(torch.device(f"cuda:{device}" if isinstance(device, int) else device))
        except (RuntimeError, TypeError):
            name = repr(device)
        if devices and name not in devices:
            reasons.append(f"device {device!r} is not the one the module's parameters are on "
                           f"({', '.join(sorted(devices))}); the wrapper does not move the module")
    return reasons


def _problem(module: torch.nn.Module, named: List[Tuple[str, torch.nn.Parameter]], bucket_cap_mb: object,
             compression: Optional[str], flags: dict, overlap: object,
             more: List[str]) -> Tuple[int, Optional[InputProblem]]:
    """The bucket cap in bytes (the default's where the one given is unusable) and what this
    rank cannot wrap: a dtype, a sparse-gradient layer, an argument."""
    reasons = list(more) + [f"parameter {name!r} is {param.dtype} (reducible: {', '.join(map(str, REDUCIBLE))})"
               for name, param in named if param.dtype not in REDUCIBLE]
    reasons += [f"module {name!r} makes sparse gradients (sparse=True; use a dense one, or the parameter "
                f"server's rows)" for name, sub in module.named_modules() if getattr(sub, "sparse", False) is True]
    if not (compression is None or isinstance(compression, str) and compression in COMPRESSIONS):
        reasons.append(f"compression {compression!r} is not one of None, {', '.join(map(repr, COMPRESSIONS))}")
    usable = isinstance(bucket_cap_mb, Real) and not isinstance(bucket_cap_mb, bool) \
        and math.isfinite(bucket_cap_mb) and 0 < bucket_cap_mb <= MAX_BUCKET_CAP_MB
    if not usable:
        reasons.append(f"bucket_cap_mb must be a number above 0 and at most {MAX_BUCKET_CAP_MB:g}, "
                       f"got {bucket_cap_mb!r}")
    cap = int(bucket_cap_mb * 2 ** 20) if usable else int(DEFAULT_BUCKET_CAP_MB * 2 ** 20)
    reasons += [f"{flag} must be True or False, got {value!r}" for flag, value in flags.items()
                if not isinstance(value, bool)]
    if overlap is not None and not isinstance(overlap, bool):
        reasons.append(f"overlap must be None, True or False, got {overlap!r}")
    if not named:
        reasons.append("the module has no parameter that takes a gradient (or is not a torch.nn.Module)")
    return max(cap, 1), InputProblem(ProblemKind.UNUSABLE_ARRAY, "; ".join(reasons)) if reasons else None
