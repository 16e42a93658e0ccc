"""Your own training loop, elastic: it survives a SIGKILLed rank and takes in new ranks.

    hpcreduce launch -n 4 --ft -- python examples/elastic_regression.py --kill-at 20
    echo 5 > ranks.txt; hpcreduce launch -n 4 --ft -- python examples/elastic_regression.py --discover ranks.txt

Linear regression by minibatch SGD, written by hand with numpy: each step's global batch
is made from (seed, step), split over the ranks by rank number, and the gradients are
summed with ``hpcreduce.allreduce``. ``hpcreduce.elastic`` keeps the weights and the step
in a ``State``; after a failure (or when ranks join) every rank goes on from rank 0's last
commit and the next step is split over the ranks there are now, so the run computes the
same steps as one without failures, up to summation order. ``--kill-at STEP`` is a
rehearsal: the last rank SIGKILLs itself at that step (once).
"""
import argparse
import json
import os
import signal

import numpy as np

import hpcreduce
from hpcreduce import elastic

FEATURES, BATCH, NOISE = 8, 512, 0.1
TRUE_W = np.linspace(-1.0, 1.0, FEATURES)


def my_share(step: int, seed: int, rank: int, size: int):
    """This rank's rows of step ``step``'s global batch (the same batch for any size)."""
    rng = np.random.default_rng([seed, step])
    x = rng.normal(size=(BATCH, FEATURES))
    y = x @ TRUE_W + NOISE * rng.normal(size=BATCH)
    return x[rank::size], y[rank::size]


def recovered(state) -> bool:
    """Whether this rank has been through a recovery (the rehearsal kills once)."""
    return any(event["kind"] == "failure" for event in state.events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-at", type=int, metavar="STEP", help="the last rank SIGKILLs itself at STEP")
    parser.add_argument("--discover", metavar="FILE", help="a file holding the wanted number of ranks")
    parser.add_argument("--out", metavar="FILE", help="rank 0 writes the result here as JSON")
    args = parser.parse_args()

    ctx = hpcreduce.init()
    state = elastic.State(weights=np.zeros(FEATURES), step=0, discover=args.discover)
    state.register_reset_callbacks([lambda: print(f"rank {ctx.rank}: now {ctx.size} ranks, "
                                                  f"from step {state.step}", flush=True)])

    @elastic.run
    def train(state):
        while state.step < args.steps:
            if args.kill_at == state.step and ctx.rank == ctx.size - 1 and not recovered(state):
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = my_share(state.step, args.seed, ctx.rank, ctx.size)
            grad = x.T @ (x @ state.weights - y)
            state.weights -= args.lr * hpcreduce.allreduce(grad, "sum") / BATCH
            state.step += 1
            state.commit()

    train(state)
    x, y = my_share(args.steps, args.seed, 0, 1)
    loss = float(0.5 * np.mean((x @ state.weights - y) ** 2))
    if ctx.rank == 0:
        print(f"final: {ctx.size} ranks, loss {loss:.6f} (noise floor {NOISE ** 2 / 2:.6f}), "
              f"{len(state.events)} change(s) of ranks", flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as handle:
                json.dump({"ranks": ctx.size, "loss": loss, "weights": state.weights.tolist(),
                           "steps": state.step, "events": state.events}, handle)


if __name__ == "__main__":
    main()
