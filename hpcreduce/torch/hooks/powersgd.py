"""PowerSGD (Vogels et al., 2019) as torch's ``PowerSGDState`` and ``powerSGD_hook``, over hpcreduce.

For the first ``start_powerSGD_iter`` steps the bucket's mean is reduced as it is. Then each
gradient matrix M (n x m, a tensor viewed as rows x the rest) that compresses at least
``min_compression_rate`` times is replaced by a rank-r product P Q^T: P = M Q is summed over
the ranks and orthogonalised, Q = M^T P is averaged, M ~ P Q^T; 1-D and small tensors are
averaged uncompressed. Bytes on the wire per matrix: (n + m) r instead of n m. With
``use_error_feedback`` what the compression lost is added to the next step's gradient; with
``warm_start`` each step's Q starts from the last one. The first Qs come from one seeded
generator, the same on every rank. The state's ``state_dict`` (all but the error feedback) is
rank 0's on every rank after the ranks change (``hooks.agreement``), and can be checkpointed.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from ...runtime.context import Comm
from .bucket import GradBucket, all_reduce
from .default import allreduce_hook


class PowerSGDState:
    """What PowerSGD keeps between steps (torch's signature: ``process_group`` None is the
    wrapper's ranks; ``batch_tensors_with_same_shape`` is accepted, each matrix goes alone)."""

    def __init__(self, process_group: Comm = None, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                 use_error_feedback: bool = True, warm_start: bool = True, orthogonalization_epsilon: float = 0,
                 random_seed: int = 0, compression_stats_logging_frequency: int = 10_000,
                 batch_tensors_with_same_shape: bool = False):
        if int(matrix_approximation_rank) < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank must be at least 1, "
                             f"got {matrix_approximation_rank}")
        self.process_group = process_group
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.compression_stats_logging_frequency = compression_stats_logging_frequency
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.iter = 0
        self.error_dict: Dict[int, torch.Tensor] = {}
        self.p_memory_dict: Dict[int, torch.Tensor] = {}
        self.q_memory_dict: Dict[int, torch.Tensor] = {}
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count a step when its last bucket is reduced."""
        if bucket.is_last():
            self.iter += 1

    def state_dict(self) -> Dict[str, Any]:
        """What every rank must hold alike (the step count, the seeded generator, the P and Q
        memory), for a checkpoint or a regroup; the error feedback is each rank's own and stays."""
        return {"iter": self.iter, "rng": self.rng.get_state(), "p_memory_dict": self.p_memory_dict,
                "q_memory_dict": self.q_memory_dict,
                "total_numel": (self.total_numel_before_compression, self.total_numel_after_compression)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """``state_dict()``'s values back (copied)."""
        self.iter = int(state["iter"])
        self.rng.set_state(state["rng"])
        self.p_memory_dict = {int(k): v.clone() for k, v in state["p_memory_dict"].items()}
        self.q_memory_dict = {int(k): v.clone() for k, v in state["q_memory_dict"].items()}
        self.total_numel_before_compression, self.total_numel_after_compression = map(int, state["total_numel"])

    def compression_stats(self) -> Tuple[float, int, int]:
        """(compression rate, elements before, elements after) over every compressed step."""
        after = self.total_numel_after_compression
        return (self.total_numel_before_compression / after if after else 0.0,
                self.total_numel_before_compression, after)


def orthogonalize(matrices: torch.Tensor, epsilon: float = 0) -> None:
    """Make the columns of each matrix of the batch ``matrices`` orthonormal, in place (Gram-Schmidt)."""
    for i in range(matrices.shape[2]):
        column = matrices[:, :, i:i + 1]
        column.div_(torch.linalg.vector_norm(column, dim=1, keepdim=True) + epsilon)
        if i + 1 < matrices.shape[2]:
            rest = matrices[:, :, i + 1:]
            rest.sub_(column * torch.sum(column * rest, dim=1, keepdim=True))


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> "torch.futures.Future[torch.Tensor]":
    """The bucket's mean, its large matrices compressed to rank ``state.matrix_approximation_rank``."""
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(state.process_group, bucket)
    index, group = bucket.index(), state.process_group
    if state.use_error_feedback:
        if index in state.error_dict:
            buffer.add_(state.error_dict[index])
        else:
            state.error_dict[index] = torch.zeros_like(buffer)
        before = buffer.detach().clone()
    compress, plain = _split(state, bucket.gradients())
    if plain:
        together = torch.cat([tensor.reshape(-1) for tensor in plain])
        all_reduce(together, "mean", group=group)
        offset = 0
        for tensor in plain:
            tensor.copy_(together[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
    if compress:
        ps, qs = _factors(state, index, compress, buffer)
        for matrix, p, q in zip(compress, ps, qs):
            torch.matmul(matrix, q, out=p)
        all_reduce(state.p_memory_dict[index], "sum", group=group)
        for p in ps:
            orthogonalize(p.unsqueeze(0), state.orthogonalization_epsilon)
        for matrix, p, q in zip(compress, ps, qs):
            torch.matmul(matrix.t(), p, out=q)
        all_reduce(state.q_memory_dict[index], "mean", group=group)
        for matrix, p, q in zip(compress, ps, qs):
            torch.matmul(p, q.t(), out=matrix)
    if state.use_error_feedback:
        state.error_dict[index] = before - buffer
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    state.maybe_increase_iter(bucket)
    future: "torch.futures.Future[torch.Tensor]" = torch.futures.Future()
    future.set_result(buffer)
    return future


def _split(state: PowerSGDState, gradients: List[torch.Tensor]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The gradients worth compressing (as n x m matrices) and the rest (1-D and small ones)."""
    compress, plain = [], []
    for tensor in gradients:
        matrix = tensor.view(tensor.shape[0], -1) if tensor.dim() > 1 else None
        n, m = matrix.shape if matrix is not None else (tensor.numel(), 1)
        rank = min(n, m, state.matrix_approximation_rank)
        small = matrix is None or (n + m) * rank * state.min_compression_rate >= n * m
        state.total_numel_before_compression += n * m
        state.total_numel_after_compression += n * m if small else (n + m) * rank
        (plain if small else compress).append(tensor if small else matrix)
    return compress, plain


def _factors(state: PowerSGDState, index: int, matrices: List[torch.Tensor],
             like: torch.Tensor) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Views of the bucket's P and Q memory, one per matrix; fresh Qs (seeded, orthogonal)
    unless warm-started from the last step."""
    ranks = [min(*matrix.shape, state.matrix_approximation_rank) for matrix in matrices]
    fresh = not state.warm_start or index not in state.p_memory_dict
    if fresh:
        state.p_memory_dict[index] = torch.empty(sum(m.shape[0] * r for m, r in zip(matrices, ranks)),
                                                 dtype=like.dtype, device=like.device)
        state.q_memory_dict[index] = torch.empty(sum(m.shape[1] * r for m, r in zip(matrices, ranks)),
                                                 dtype=like.dtype, device=like.device)
    ps, qs, p_at, q_at = [], [], 0, 0
    for matrix, rank in zip(matrices, ranks):
        n, m = matrix.shape
        ps.append(state.p_memory_dict[index][p_at:p_at + n * rank].view(n, rank))
        qs.append(state.q_memory_dict[index][q_at:q_at + m * rank].view(m, rank))
        p_at, q_at = p_at + n * rank, q_at + m * rank
    generator = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000))) if fresh else None
    for q in qs:
        if generator is not None:
            q.copy_(torch.randn(q.shape, generator=generator, dtype=like.dtype))
        orthogonalize(q.unsqueeze(0), state.orthogonalization_epsilon)
    return ps, qs
