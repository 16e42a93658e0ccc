"""The optimizers' compiled updates against numpy, in one process, alternating, on the same arrays;
and whether both give the same bits.

- dense: ``Optimizer.update`` of a large array (the row kernel on the array seen as one row)
  against the numpy rule it replaced (``_rule``, 64K elements at a time);
- rows: ``Optimizer.update_rows`` of ``--rows`` random rows of a ``--table-rows`` x 16 table (the
  fused gather, update and scatter) against numpy's gather, rule and scatter.

    python bench/optimizers.py                  # float32, 256K / 1M / 16M elements; 4096 of 1M rows
    python bench/optimizers.py --dtype float64 --sizes 131072
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from hpcreduce.ps.optimizers import CHUNK, OPTIMIZERS, Optimizer


def numpy_rule(optimizer: Optimizer, param, grad, state, step: int) -> None:
    """The rule as numpy runs it, ``CHUNK`` elements at a time (the code before the kernels)."""
    for begin in range(0, param.size, CHUNK):
        end = begin + CHUNK
        optimizer._rule(param[begin:end], grad[begin:end], {k: v[begin:end] for k, v in state.items()}, step)


def seconds(call: Callable[[int], None], steps: int) -> float:
    """Seconds a step of ``call(step)`` over steps 1..``steps``."""
    began = time.perf_counter()
    for step in range(1, steps + 1):
        call(step)
    return (time.perf_counter() - began) / steps


def numpy_rows(optimizer: Optimizer, values, state, local, grads, step: int) -> None:
    """``update_rows`` as numpy does it: gather, the rule, scatter."""
    rows, gathered = values[local], {key: array[local] for key, array in state.items()}
    optimizer._rule(rows, grads, gathered, step)
    values[local] = rows
    for key, array in gathered.items():
        state[key][local] = array


def compare(name: str, count: int, make: Callable[[], Optimizer], start: np.ndarray, calls, rounds: int,
            steps: int) -> None:
    """Time ``calls[side](optimizer, values, state, step)`` for the numpy side ("rule") and the
    kernel, alternating for ``rounds`` (both take the same steps, so their bits must agree);
    print the best of each and whether the values and states ended equal."""
    optimizer = make()
    values = {side: start.copy() for side in calls}
    states = {side: optimizer.init_state(start) for side in calls}
    best = {side: float("inf") for side in calls}
    for _ in range(rounds):
        for side, call in calls.items():
            best[side] = min(best[side], seconds(lambda s: call(optimizer, values[side], states[side], s), steps))
    same = np.array_equal(values["rule"], values["kernel"]) and all(
        np.array_equal(states["rule"][key], states["kernel"][key]) for key in states["rule"])
    print(f"{name:<9} {count:>9} {best['rule'] * 1e6:>9.1f} us {best['kernel'] * 1e6:>9.1f} us "
          f"{best['rule'] / best['kernel']:>7.2f}x  {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--sizes", default="262144,1048576,16777216", help="elements, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="alternations; the best of each is kept")
    parser.add_argument("--rows", type=int, default=4096, help="rows a row update touches")
    parser.add_argument("--table-rows", type=int, default=1 << 20, help="rows of the table they are drawn from")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'optimizer':<9} {'elements':>9} {'numpy rule':>12} {'kernel':>12} {'speed-up':>8}  same bits")
    for name, make in OPTIMIZERS.items():
        for size in (int(s) for s in args.sizes.split(",")):
            grad = (rng.standard_normal(size) * 0.01).astype(args.dtype)
            calls = {"rule": lambda o, p, st, s, g=grad: numpy_rule(o, p, g, st, s),
                     "kernel": lambda o, p, st, s, g=grad: o.update(p, g, st, s)}
            compare(name, size, lambda m=make: m(0.01), rng.standard_normal(size).astype(args.dtype), calls,
                    args.rounds, max(3, int(3e7 // size)))
    print(f"\nrow updates, {args.rows} random rows x 16 of {args.table_rows}: gather, rule, scatter in numpy against "
          f"the fused kernel")
    print(f"{'optimizer':<9} {'rows':>9} {'numpy':>12} {'kernel':>12} {'speed-up':>8}  same bits")
    grads = (rng.standard_normal((args.rows, 16)) * 0.01).astype(args.dtype)
    batches = [np.sort(rng.choice(args.table_rows, args.rows, replace=False)) for _ in range(8)]
    table = rng.standard_normal((args.table_rows, 16)).astype(args.dtype)
    calls = {"rule": lambda o, v, st, s: numpy_rows(o, v, st, batches[s % 8], grads, s),
             "kernel": lambda o, v, st, s: o.update_rows(v, st, batches[s % 8], grads, s)}
    for name, make in OPTIMIZERS.items():
        compare(name, args.rows, lambda m=make: m(0.01), table, calls, args.rounds, 100)


if __name__ == "__main__":
    main()
