"""The one table of element types, by name: every other dtype list in the package is read from here.

``REDUCED``: what the collectives reduce, in the order of their codes (``collectives.ops``);
its floats, ``FLOATS``, in the same order, are the parameter server's wire codes
(``ps.protocol``). ``NARROW``: the 16-bit formats carried as raw bits, summed in float32 and
rounded once (``collectives.narrow``). ``WIRE``: how a worker's pushed and pulled values may
travel (``--wire-dtype``): as the table stores them (float32), or halved (float16).
"""
from __future__ import annotations

from typing import Tuple

REDUCED: Tuple[str, ...] = ("float16", "float32", "float64", "int32", "int64")
FLOATS: Tuple[str, ...] = tuple(name for name in REDUCED if name.startswith("float"))
NARROW: Tuple[str, ...] = ("float16", "bfloat16")
WIRE: Tuple[str, ...] = ("float32", "float16")
