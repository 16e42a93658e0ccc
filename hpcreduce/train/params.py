"""Whole parameters (as ring ranks hold them) versus the rows a batch touches.

A model reads sparse tables as ``SparseRows`` and returns sparse gradients that way;
ring mode holds whole tables, so it gathers rows for the model and scatters
gradients back into dense zero tables for the allreduce.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

from ..arrays import array_module
from ..ps.init import PartInit, whole_tables
from ..ps.start import checked
from .model import Grads, Model, Params, ParamSpec, SparseRows


def batch_view(model: Model, params: Mapping[str, object], batch,
               rows: Optional[Mapping[str, object]] = None) -> Params:
    """What ``model.loss_and_grads`` reads for ``batch``: dense parameters as they are,
    sparse tables as the rows the batch touches (``rows``: ``model.rows(batch)`` if known)."""
    rows = model.rows(batch) if rows is None else rows
    view: Dict[str, object] = {}
    for spec in model.param_specs():
        value = params[spec.name]
        if spec.sparse:
            if spec.name not in rows:
                raise ValueError(f"{model.name}.rows(batch) gave no ids for the sparse "
                                 f"parameter {spec.name!r}")
            ids = rows[spec.name]
            view[spec.name] = SparseRows(ids, value[array_module(value).asarray(ids)])
        else:
            view[spec.name] = value
    return view


def dense_grads(specs: Sequence[ParamSpec], grads: Grads, like: Mapping[str, object]) -> Dict[str, object]:
    """Every gradient as a whole tensor shaped like its parameter in ``like``; a sparse
    gradient is scattered into a zero table (its ids are unique, so no row is hit twice)."""
    dense: Dict[str, object] = {}
    for spec in specs:
        grad, param = grads[spec.name], like[spec.name]
        if isinstance(grad, SparseRows):
            xp = array_module(param)
            table = xp.zeros_like(param)
            table[xp.asarray(grad.ids)] = grad.values
            dense[spec.name] = table
        else:
            dense[spec.name] = grad
    return dense


def zero_grads(specs: Sequence[ParamSpec], like: Mapping[str, object]) -> Dict[str, object]:
    """Zero gradients shaped like the parameters (a worker whose share of a step is empty)."""
    return {spec.name: array_module(like[spec.name]).zeros_like(like[spec.name]) for spec in specs}


def part_init(model: Model, seed: int, specs: Sequence[ParamSpec]) -> PartInit:
    """The initial values of ``model``'s tables, made per part when the model can (its own
    ``part_init(seed, specs)``, or ``init_elements``), else sliced from ``init_params``'s whole tables."""
    own = getattr(model, "part_init", None)
    if own is not None:
        return own(seed, specs)
    elements = getattr(model, "init_elements", None)
    if elements is None:
        return whole_tables(specs, checked(model.init_params(seed), specs))
    return PartInit(specs, lambda table, flat: elements(seed, specs[table].name, flat))
