"""Elastic training for a user's own loop: the Horovod ``State`` / ``run`` pattern over ULFM.

    import hpcreduce
    from hpcreduce import elastic

    state = elastic.State(weights=w, step=0)       # numpy, cupy or torch tensors, and scalars

    @elastic.run
    def train(state):
        while state.step < steps:
            grad = compute(state.weights)
            state.weights -= lr * hpcreduce.allreduce(grad, "mean")
            state.step += 1
            state.commit()                         # a point the job may go back to

    train(state)

When a rank dies inside ``train``, every survivor's collective fails; ``run`` shrinks the
job to the survivors (revoke, shrink, agree), restores every rank's last commit, makes
rank 0's state everyone's (``sync``), calls the reset callbacks (re-split the data there)
and calls ``train(state)`` again. Growth (``State(discover=FILE)``) spawns ranks at a commit;
they start the same program, get the state and join the loop. hpcreduce's collectives and
``hpcreduce.torch`` run on the default context, whose communicator is swapped underneath.
"""
from .driver import run
from .state import State

__all__ = ["State", "run"]
