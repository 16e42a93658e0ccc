"""Checks of what a worker is handed, before anything is sent: arrays and row ids."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ..arrays import is_device_array, to_host
from ..errors import PSInputError
from .tables import ParamSpec, first_bad_id


def check_array(what: str, array, shape, dtype, *, output: bool = False) -> None:
    """``array`` is a numpy array of ``shape`` and ``dtype``; an ``output`` one is also
    C-contiguous and writable (replies are received into it)."""
    if type(array) is np.ndarray and array.shape == tuple(shape) and array.dtype == dtype and \
            (not output or (array.flags.c_contiguous and array.flags.writeable)):
        return  # the common case, in few steps: a worker checks every call's arrays
    if not isinstance(array, np.ndarray):
        raise PSInputError(f"{what} must be a numpy array, got {type(array).__name__}")
    if tuple(array.shape) != tuple(shape):
        raise PSInputError(f"{what} has shape {tuple(array.shape)}, the table needs {tuple(shape)}")
    if array.dtype != np.dtype(dtype):
        raise PSInputError(f"{what} has dtype {array.dtype}, the table needs {np.dtype(dtype)}")
    if output and not array.flags.c_contiguous:
        raise PSInputError(f"{what} must be C-contiguous")
    if output and not array.flags.writeable:
        raise PSInputError(f"{what} is read-only; the pulled values are written into it")


def table_rows(spec: ParamSpec) -> Optional[int]:
    """The rows of a fixed sparse table; None for a dynamic one (any int64 id)."""
    return None if spec.dynamic is not None else spec.shape[0]


def checked_ids(what: str, ids, rows: Optional[int]) -> np.ndarray:
    """``ids`` as int64, if they are a 1-D integer array of row ids in [0, rows) (any int64
    when ``rows`` is None); an id out of range is reported as given (checked before the
    conversion, which would wrap it)."""
    try:
        array = np.asarray(ids)
    except (ValueError, TypeError, OverflowError) as err:
        raise PSInputError(f"{what}: ids must be a one-dimensional integer array ({err})") from None
    if array.dtype == object and array.ndim == 1 and all(isinstance(i, int) for i in array.tolist()):
        outside = next((i for i in array.tolist() if not -2**63 <= i < 2**63), None)
        if outside is not None:
            raise PSInputError(f"{what}: id {outside} is outside int64 (row ids are int64)")
        array = array.astype(np.int64)  # Python ints that all fit, in an object array
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise PSInputError(f"{what}: ids must be a one-dimensional integer array, "
                           f"got dtype {array.dtype} and shape {array.shape}")
    if rows is None:
        bad = array[array > np.iinfo(np.int64).max] if array.dtype.kind == "u" else array[:0]
        if bad.size:
            raise PSInputError(f"{what}: id {int(bad[0])} is outside int64 (dynamic tables are keyed by int64)")
        return array.astype(np.int64, copy=False)
    if array.dtype == np.int64:  # the usual ids: one compiled pass
        bad = first_bad_id(array, rows)
        if bad >= 0:
            raise PSInputError(f"{what}: row id {int(array[bad])} out of range [0, {rows})")
        return array
    bad = array[array >= rows] if array.dtype.kind == "u" else array[(array < 0) | (array >= rows)]
    if bad.size:
        raise PSInputError(f"{what}: row id {int(bad[0])} out of range [0, {rows})")
    return array.astype(np.int64, copy=False)


def sorted_push_rows(table: str, spec: ParamSpec, ids, grads) -> Tuple[np.ndarray, np.ndarray]:
    """A push's ids (checked, unique) and gradients (checked) on the host, sorted by id (copies:
    the caller may change its arrays once the call returns)."""
    ids = checked_ids(f"push_rows to {table!r}", to_host(ids) if is_device_array(ids) else ids, table_rows(spec))
    grads = to_host(grads) if is_device_array(grads) else grads
    check_array(f"push_rows to {table!r}: gradients", grads, (len(ids),) + tuple(spec.shape[1:]), spec.dtype)
    if increasing(ids):  # already sorted and unique (np.unique's, torch.unique's): no sort
        return ids.copy(), np.array(grads, order="C")  # the worker's own copies: in flight, key-cached
    order = np.argsort(ids, kind="stable")
    ids, grads = ids[order], np.ascontiguousarray(grads[order])
    if np.any(ids[1:] == ids[:-1]):
        raise PSInputError(f"push_rows to {table!r}: ids must be unique (sum the gradients of repeated rows)")
    return ids, grads


def increasing(ids: np.ndarray) -> bool:
    """Whether int64 ``ids`` are sorted and unique (one compiled pass)."""
    return first_bad_id(ids, None, increasing=True) < 0
