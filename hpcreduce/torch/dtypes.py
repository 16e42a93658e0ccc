"""The torch side of the one dtype table (``arrays.dtypes``: ``REDUCED``, the numpy dtypes the
collectives reduce, and ``NARROW``, the 16-bit ones carried as bits)."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from ..arrays.dtypes import NARROW as FORMATS
from ..arrays.dtypes import REDUCED

NUMPY: Dict[torch.dtype, str] = {getattr(torch, name): name for name in REDUCED}
"""torch dtypes whose tensors are viewed as numpy/cupy arrays the collectives reduce: the numpy name."""
NARROW: Dict[torch.dtype, str] = {getattr(torch, fmt): fmt for fmt in FORMATS}
"""16-bit dtypes reduced as raw bits, accumulated in float32 and rounded once (``collectives.narrow``)."""
FORMAT_DTYPES: Dict[str, torch.dtype] = {fmt: dtype for dtype, fmt in NARROW.items()}
REDUCIBLE: Tuple[torch.dtype, ...] = tuple(sorted({dtype for dtype in [*NUMPY, *NARROW] if dtype.is_floating_point},
                                                  key=lambda dtype: (dtype.itemsize, str(dtype))))
"""Gradient dtypes the DDP wrapper reduces (16-bit ones accumulate in float32)."""
