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

import numpy as np

from hpcreduce.ps.optimizers import CHUNK, OPTIMIZERS, Optimizer


def numpy_rule(optimizer: Optimizer, param, grad, state, step: int) -> None:
    """The rule as numpy runs it, ``CHUNK`` elements at a time (the code before the kernels)."""
    for begin in range(0, param.size, CHUNK):
        end = begin + CHUNK
        optimizer._rule(param[begin:end], grad[begin:end], {k: v[begin:end] for k, v in state.items()}, step)


def seconds(call, steps: int) -> float:
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


def rows_case(name: str, make, args, rng) -> None:
    """One optimizer's row updates: numpy against the fused kernel."""
    optimizer = make(0.01)
    start = rng.standard_normal((args.table_rows, 16)).astype(args.dtype)
    grads = (rng.standard_normal((args.rows, 16)) * 0.01).astype(args.dtype)
    batches = [np.sort(rng.choice(args.table_rows, args.rows, replace=False)) for _ in range(8)]
    values = {side: start.copy() for side in ("rule", "kernel")}
    states = {side: optimizer.init_state(start) for side in ("rule", "kernel")}
    calls = {"rule": lambda s: numpy_rows(optimizer, values["rule"], states["rule"], batches[s % 8], grads, s),
             "kernel": lambda s: optimizer.update_rows(values["kernel"], states["kernel"], batches[s % 8], grads, s)}
    best = {side: min(seconds(call, 100) for _ in range(args.rounds)) for side, call in calls.items()}
    same = np.array_equal(values["rule"], values["kernel"]) and all(
        np.array_equal(states["rule"][key], states["kernel"][key]) for key in states["rule"])
    print(f"{name:<9} {args.rows:>9} {best['rule'] * 1e6:>9.1f} us {best['kernel'] * 1e6:>9.1f} us "
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
            start = rng.standard_normal(size).astype(args.dtype)
            optimizer = make(0.01)
            params = {side: start.copy() for side in ("rule", "kernel")}
            states = {side: optimizer.init_state(start) for side in ("rule", "kernel")}
            steps = max(3, int(3e7 // size))
            best = {"rule": float("inf"), "kernel": float("inf")}
            for _ in range(args.rounds):  # both sides take the same steps, so their bits must agree
                best["rule"] = min(best["rule"], seconds(
                    lambda s: numpy_rule(optimizer, params["rule"], grad, states["rule"], s), steps))
                best["kernel"] = min(best["kernel"], seconds(
                    lambda s: optimizer.update(params["kernel"], grad, states["kernel"], s), steps))
            same = np.array_equal(params["rule"], params["kernel"]) and all(
                np.array_equal(states["rule"][key], states["kernel"][key]) for key in states["rule"])
            print(f"{name:<9} {size:>9} {best['rule'] * 1e6:>9.1f} us {best['kernel'] * 1e6:>9.1f} us "
                  f"{best['rule'] / best['kernel']:>7.2f}x  {same}")
    print(f"\nrow updates, {args.rows} random rows x 16 of {args.table_rows}: gather, rule, scatter in numpy against "
          f"the fused kernel")
    print(f"{'optimizer':<9} {'rows':>9} {'numpy':>12} {'kernel':>12} {'speed-up':>8}  same bits")
    for name, make in OPTIMIZERS.items():
        rows_case(name, make, args, rng)


if __name__ == "__main__":
    main()
