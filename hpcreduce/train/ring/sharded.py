"""``--shard-optimizer`` for the ring trainer (ZeRO-1): each rank keeps 1/N of the optimizer state.

The summed gradients come from the ring's usual reduction (the same engine and buckets, so the
same sums bit for bit); each rank then steps only its slice of every parameter (a dense
parameter's flat elements, a sparse table's rows, split as evenly as they go: rank r owns
``[n r / N, n (r + 1) / N)``) with its slice of the optimizer state, and one allgather per
parameter (``collectives.variable.gather_rows``) gives every rank the others' updated slices. The optimizers are elementwise and a
table's lazy row updates are per row, so the parameters equal the unsharded run's exactly.
Optimizer state per rank: about 1/N of the unsharded one. Cost per step beyond the unsharded
run: one allgather of the parameters ((N-1)/N x model bytes received per rank).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ...arrays import array_module
from ...collectives.variable import gather_rows
from ...ps import ParamSpec
from ...ps.optimizers import Optimizer
from ...runtime.context import Context


class ShardedUpdate:
    """This rank's slices of the parameters and how it steps them, for ``rank`` of ``size``."""

    def __init__(self, ctx: Context, specs: Sequence[ParamSpec], optimizer: Optimizer):
        self.ctx, self.specs, self.optimizer = ctx, list(specs), optimizer
        self.rank, self.size = ctx.rank, ctx.size

    def units(self, spec: ParamSpec, param: np.ndarray) -> Tuple[int, int]:
        """How many units ``param`` splits into (a table's rows, a dense parameter's elements)
        and the elements per unit."""
        if spec.sparse:
            return len(param), int(np.prod(param.shape[1:], dtype=np.int64))
        return param.size, 1

    def cuts(self, spec: ParamSpec, param: np.ndarray) -> List[int]:
        """Every rank's first unit, and the end: rank r owns units ``cuts[r]:cuts[r + 1]``."""
        units, _ = self.units(spec, param)
        return [units * r // self.size for r in range(self.size + 1)]

    def mine(self, spec: ParamSpec, param: np.ndarray) -> np.ndarray:
        """This rank's slice of ``param`` (a view: rows of a table, flat elements otherwise)."""
        cuts = self.cuts(spec, param)
        flat = param if spec.sparse else param.reshape(-1)
        return flat[cuts[self.rank]:cuts[self.rank + 1]]

    def init_state(self, params: Dict[str, np.ndarray]) -> Dict[str, Dict[str, np.ndarray]]:
        """Zeroed optimizer state for this rank's slice of each parameter."""
        return {spec.name: self.optimizer.init_state(self.mine(spec, params[spec.name])) for spec in self.specs}

    def apply(self, params: Dict[str, np.ndarray], grads: Dict[str, np.ndarray],
              states: Dict[str, Dict[str, np.ndarray]], scale: float, step: int) -> None:
        """Step this rank's slices with ``scale`` x the summed gradients, then gather every slice."""
        for spec in self.specs:
            param = params[spec.name]
            mine, grad = self.mine(spec, param), self.mine(spec, grads[spec.name])
            grad *= scale
            if spec.sparse:
                rows_update(self.optimizer, mine, grad, states[spec.name], step)
            else:
                self.optimizer.update(mine, grad, states[spec.name], step)
            self._gather(spec, param)

    def _gather(self, spec: ParamSpec, param: np.ndarray) -> None:
        """Every rank's updated slice of ``param`` into every rank's copy (``collectives``' rows
        gathered by counts every rank knows, so nothing to agree first; this rank's slice copied
        out of the result it is gathered into)."""
        whole = param if spec.sparse else param.reshape(-1)
        cuts = self.cuts(spec, param)
        gather_rows(self.ctx, whole[cuts[self.rank]:cuts[self.rank + 1]].copy(), np.diff(cuts), whole)


def rows_update(optimizer: Optimizer, param, grad, arrays: Dict[str, object], step: int) -> None:
    """A table's lazy update (numpy or cupy), as parameter servers give it: only rows with a non-zero
    gradient go through the optimizer."""
    rows = array_module(param).flatnonzero(grad.reshape(len(grad), -1).any(axis=1))
    row_param, row_arrays = param[rows], {name: value[rows] for name, value in arrays.items()}
    optimizer.update(row_param, grad[rows], row_arrays, step)
    param[rows] = row_param
    for name, value in row_arrays.items():
        arrays[name][rows] = value
