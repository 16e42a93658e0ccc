"""``ElasticSampler``: ``DistributedSampler``'s contract, resharded when the job's ranks change.

    sampler = hpcreduce.torch.ElasticSampler(dataset, shuffle=True, seed=0)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler)

    @elastic.run
    def train(state):
        loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler)  # made again after a change
        for epoch in range(sampler.epoch, epochs):
            sampler.set_epoch(epoch)                 # the same epoch again: nothing changes
            for x, y in loader:
                ...                                  # forward, backward, gradients reduced, step
                sampler.record_batch(len(x))         # this step's samples are consumed
                state.commit()

Each epoch's order is DistributedSampler's (``torch.randperm`` seeded with ``seed + epoch``,
or 0..n-1 without ``shuffle``). The sampler keeps how many samples of the epoch the job has
consumed (``record_batch``: this rank's batch times the number of ranks), and each iteration
deals the rest out by stride: rank r of n takes the rest's items r, r + n, r + 2n, ... A step
in which every rank takes b samples consumes exactly the rest's first b x n, whatever n is,
so after a failure or growth the rest of the epoch is dealt out among the ranks there are
then, none skipped or repeated. The rank and the number of ranks are read from the context
when an iteration starts (the default context's communicator is swapped under a recovery).
Uneven tail, as DistributedSampler: the rest is padded with its own first items up to a
multiple of n (those samples are seen twice in the epoch's last step), or with ``drop_last``
cut to one (the tail is not seen). ``state_dict()`` / ``load_state_dict()`` hold the epoch and
the samples consumed, so an ``elastic.State`` commits, restores and syncs it, and a
newcomer continues where the job is.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Sized, Union

import torch

from ..errors import UnsupportedInputError
from ..runtime.context import resolve


class ElasticSampler(torch.utils.data.Sampler):
    """Indices of ``dataset_or_len`` (a dataset, or its length) for this rank (see the module
    docstring). ``comm``: as ``hpcreduce.allreduce`` takes it (default: the default context)."""

    def __init__(self, dataset_or_len: Union[Sized, int], *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, comm=None):
        length = dataset_or_len if isinstance(dataset_or_len, int) else len(dataset_or_len)
        if isinstance(length, bool) or length < 0:
            raise UnsupportedInputError(f"ElasticSampler: a dataset of {length} samples (want 0 or more)")
        self.length, self.shuffle, self.seed, self.drop_last, self._comm = length, shuffle, seed, drop_last, comm
        self.epoch = 0
        self.consumed = 0

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (its own order, nothing consumed); the current epoch again
        (a loop resumed after a failure) changes nothing."""
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def record_batch(self, samples: int) -> None:
        """This step consumed ``samples`` of this rank's indices (the same on every rank: its
        batch size); the job consumed that many times the number of ranks."""
        size = resolve(self._comm).size
        self.consumed = min(self.length, self.consumed + samples * size)

    def order(self) -> List[int]:
        """The epoch's order of all indices (``torch.randperm`` seeded with ``seed + epoch``)."""
        if not self.shuffle:
            return list(range(self.length))
        return torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def __iter__(self) -> Iterator[int]:
        context = resolve(self._comm)
        rest = self.order()[self.consumed:]
        total = self._per_rank(len(rest), context.size) * context.size
        while len(rest) < total:  # pad with the rest's first items (more than once if it is short)
            rest += rest[:total - len(rest)]
        return iter(rest[context.rank:total:context.size])

    def __len__(self) -> int:
        return self._per_rank(self.length - self.consumed, resolve(self._comm).size)

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "consumed": self.consumed, "length": self.length, "seed": self.seed,
                "shuffle": self.shuffle}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The epoch and the samples consumed of ``state``; ``ValueError`` when it is the state of
        a sampler over another number of samples, or with another seed or shuffle."""
        for key in ("length", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(f"ElasticSampler: the state is of a sampler with {key} {state[key]}, "
                                 f"this one has {key} {getattr(self, key)}")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    def _per_rank(self, rest: int, size: int) -> int:
        return rest // size if self.drop_last else math.ceil(rest / size)
