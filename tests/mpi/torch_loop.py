"""What the elastic torch loop scripts share: the data, its batches, one step, and the
one-process run they must equal."""
import numpy as np
import torch
import torch.nn.functional as F

FEATURES, CLASSES, BATCH, EPOCHS, SEED = 10, 3, 12, 2, 5


def data(samples: int):
    """(X, Y, a dataset of (x, y, index)): ``samples`` points, the label a fixed linear rule."""
    X = torch.randn(samples, FEATURES, generator=torch.Generator().manual_seed(0))
    Y = (X[:, :CLASSES] * torch.tensor([1.0, -2.0, 0.5])).argmax(dim=1)
    return X, Y, torch.utils.data.TensorDataset(X, Y, torch.arange(samples))


def batches(dataset, sampler, ranks: int):
    """(epoch, x, y, index, counts) of this rank's share of each global batch from the sampler's
    epoch on (``counts``: how often each sample is in it, to be summed over the ranks)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH // ranks, sampler=sampler)
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for x, y, index in loader:
            yield epoch, x, y, index, np.bincount(index.numpy(), minlength=len(dataset)).astype(np.int64)


def step(model, optimizer, scheduler, x, y, reduce, ranks: int = 1) -> None:
    """One step on this rank's part of a global batch of ``BATCH``; ``reduce()`` between backward and
    the optimizer; ``ranks``: a wrapper's mean is over that many ranks (the loss scaled up to a sum)."""
    optimizer.zero_grad()
    (F.cross_entropy(model(x), y, reduction="sum") * ranks / BATCH).backward()
    reduce()
    optimizer.step()
    scheduler.step()


def one_process_run(model, optimizer, scheduler, X, Y) -> None:
    """Train ``model`` as one process would over ``EPOCHS`` of ElasticSampler's order."""
    for epoch in range(EPOCHS):
        order = torch.randperm(len(X), generator=torch.Generator().manual_seed(SEED + epoch))
        for start in range(0, len(X), BATCH):
            batch = order[start:start + BATCH]
            step(model, optimizer, scheduler, X[batch], Y[batch], lambda: None)


def relative_gaps(tensors, references) -> list:
    """Each tensor's largest difference from its reference, relative to the reference's largest value."""
    with torch.no_grad():
        return [float((t - r).abs().max() / r.abs().max()) for t, r in zip(tensors, references)]
