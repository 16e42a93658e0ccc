"""Helpers the MPI check scripts share: expecting an error, ending the job on one rank's error,
and a model that misbehaves on one rank."""
import sys
import traceback

from mpi4py import MPI

from hpcreduce.train.model import Model

RANK = MPI.COMM_WORLD.Get_rank()


def expect(error, fragment, call):
    """``call()`` raises ``error`` with ``fragment`` in its message (returned), on this rank."""
    try:
        call()
    except error as err:
        assert fragment in str(err), f"rank {RANK}: {fragment!r} not in {err}"
        return str(err)
    raise AssertionError(f"rank {RANK}: no {error.__name__} for {fragment!r}")


def abort_job_on_error() -> None:
    """An uncaught error on this rank ends the whole job (MPI_Abort): under ULFM a rank that
    exits is not a failure to its peers, which would wait for it."""
    def abort(kind, value, trace):
        traceback.print_exception(kind, value, trace)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.excepthook = abort


class Wrapped(Model):
    """``inner``, except on world rank ``on_rank``, where ``act(call, output)`` runs after each
    step and may change the gradients (to slow a worker down or to break its gradients)."""

    def __init__(self, inner, on_rank, act):
        self.inner, self.on_rank, self.act, self.calls = inner, on_rank, act, 0
        self.name = inner.name

    def param_specs(self):
        return self.inner.param_specs()

    def init_params(self, seed):
        return self.inner.init_params(seed)

    def rows(self, batch):
        return self.inner.rows(batch)

    def loss_and_grads(self, params, batch):
        output = self.inner.loss_and_grads(params, batch)
        if RANK == self.on_rank:
            self.act(self.calls, output)
        self.calls += 1
        return output
