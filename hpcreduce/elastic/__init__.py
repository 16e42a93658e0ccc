"""Elastic training: the Horovod ``State`` / ``run`` pattern over ULFM, for users' loops and trainers.

    import hpcreduce
    from hpcreduce import elastic

    state = elastic.State(weights=w, step=0)       # numpy, cupy or torch tensors, dicts of arrays, scalars
    # torch: elastic.State(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
    #                      rng=elastic.RandomStates(), step=0): each restored and synced in place

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
and calls ``train(state)`` again. ``State(discover=FILE)`` reads a discovery file at commits
(a number of ranks or ``HOST[:SLOTS]`` lines): ranks it no longer wants leave (they exit 0),
and when it wants more, ranks are spawned (the same program), get the state and join the loop.
hpcreduce's collectives and ``hpcreduce.torch`` run on the default context, whose
communicator is swapped underneath.

A trainer builds on the same pieces (the ring trainer does, ``train.ring.ring_driver``): a
``Policy`` of its own (its growth rule, kill schedule, replacement, event details), values in
``no_copy`` (changed only after a step committed by ``agreed``: no copy per step), and the
loop's ``request_resize`` before each step, ``save_checkpoint`` and ``resume_checkpoint``.
Every change of ranks is a ``Change`` (an ``ft.events.RecoveryEvent``) in ``state.job.changes``,
and a dict in ``state.events``.
"""
from .agreement import Interrupted, agreed
from .checkpoints import resume_checkpoint, save_checkpoint
from .driver import run
from .job import Change, Job
from .policy import Policy
from .random_states import RandomStates
from .state import ResizeRequested, State, request_resize

__all__ = ["Change", "Interrupted", "Job", "Policy", "RandomStates", "ResizeRequested", "State", "agreed",
           "request_resize", "resume_checkpoint", "run", "save_checkpoint"]
