"""An alpha-beta cost model of a data-parallel step: ring AllReduce against parameter server.

A message of n bytes between two ranks takes ``alpha + n * beta`` seconds (latency
alpha, inverse bandwidth beta). ``fit_link`` fits both by least squares to allreduce
times measured in the same run; with the step's other costs measured in the same run
(``StepCosts``), ``predict`` gives the time per step of both topologies at any number
of ranks, and ``recommend`` says which to book. Across nodes there are two links, within a
node (``_i``) and between nodes (``_x``), each fitted to ping-pong times of the same run
(``fit_link(..., ring=False)``); ``predict_nodes`` forecasts M nodes of P ranks, N = M*P.
Formulas (docs/cost-model.md):

    ring, N ranks:      g(N) + t_apply + 2(N-1)*alpha + 2(N-1)/N * n*beta
    PS, K servers,      g(W) + 2*max(K*alpha + m*beta, W*alpha + W*m/K*beta)
    W = N-K workers:      + t_apply * min(1, W*m/n) / K
    across nodes:       ring over alpha_x, beta_x; PS over alpha_x, beta_x
    hierarchical:       g(N) + t_apply + 2*ceil(log2 P)*(alpha_i + n*beta_i)
                          + 2(M-1)*alpha_x + 2(M-1)/M * n*beta_x

g(W) = g0 + g1/W: a worker's gradient time, fitted to the ring runs that do not
oversubscribe the cores (g1/W shrinks with its share of a strong-scaling batch; g0 is
what every step costs anyway); t_apply: the optimizer over the whole model; n: the
allreduced bytes (the whole model, sparse tables densified); m = m(W) = c + d/W: bytes
a PS worker pushes (and pulls) per step, fitted to the PS runs (dense models: m = n;
sparse ones move the rows a worker's share touches).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

PS_PIECE_BYTES = 64 << 10  # the PS cuts only tables of at least 64 KiB over its servers


@dataclass(frozen=True)
class Link:
    """Point-to-point latency ``alpha_s`` and inverse bandwidth ``beta_s_per_byte``, and the
    fit they came from: ``ranks`` of the allreduce, ``points`` sizes, ``rms_relative_error``."""

    alpha_s: float
    beta_s_per_byte: float
    ranks: int
    points: int
    rms_relative_error: float

    @property
    def bandwidth_GBps(self) -> float:
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


@dataclass(frozen=True)
class StepCosts:
    """What a step costs apart from the network: a worker's gradient time g(W) =
    ``grad_fixed_s`` + ``grad_per_share_s`` / W, ``apply_s`` (the optimizer over the whole
    model), ``ring_bytes`` n, a PS worker's bytes each way m(W) = ``ps_bytes_fixed`` +
    ``ps_bytes_per_share`` / W; ``batch``: the one-rank run's, the global batch of every
    run unless ``weak`` (then per worker)."""

    grad_fixed_s: float
    grad_per_share_s: float
    apply_s: float
    batch: int
    ring_bytes: float
    ps_bytes_fixed: float
    ps_bytes_per_share: float
    weak: bool = False

    def grad_s(self, workers: int) -> float:
        return self.grad_fixed_s + self.grad_per_share_s / workers

    def global_batch(self, workers: int) -> int:
        return self.batch * workers if self.weak else self.batch

    def ps_bytes(self, workers: int) -> float:
        return self.ps_bytes_fixed + self.ps_bytes_per_share / workers

    def useful_servers(self) -> int:
        """Servers that can hold a piece of the model: the PS cuts a table in pieces of at
        least 64 KiB (smaller tables go whole to one server), so more would stand idle."""
        return max(1, int(self.ring_bytes // PS_PIECE_BYTES))


def nonnegative_fit(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> Tuple[float, float]:
    """``(a, b) >= 0`` minimising sum((weights * (a + b*x - y))**2): least squares, and
    where it gives a negative coefficient the best fit with that coefficient zero."""
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    target = y * weights
    if len(x) >= 2:
        (a, b), *_ = np.linalg.lstsq(design, target, rcond=None)
        if a >= 0 and b >= 0:
            return float(a), float(b)
    candidates = []
    for column in (0, 1):
        norm = float(design[:, column] @ design[:, column])
        coefficient = max(0.0, float(design[:, column] @ target) / norm) if norm > 0 else 0.0
        pair = (coefficient, 0.0) if column == 0 else (0.0, coefficient)
        candidates.append((float(np.sum((design @ np.array(pair) - target) ** 2)), pair))
    return min(candidates)[1]


def fit_link(sizes: Sequence[float], seconds: Sequence[float], ranks: int, *, ring: bool = True) -> Link:
    """alpha and beta from times of ``sizes`` bytes, fitted on relative error (every size
    counts alike): ring allreduce times on ``ranks`` ranks, t = 2(N-1)*alpha + 2(N-1)/N * n*beta,
    or (``ring=False``) one-way point-to-point times between two ranks, t = alpha + n*beta."""
    if ranks < 2:
        raise ValueError("fitting alpha and beta needs an allreduce over at least 2 ranks")
    x, y = np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if len(x) < 2 or np.any(y <= 0):
        raise ValueError("fitting alpha and beta needs positive times of at least 2 message sizes")
    a, b = nonnegative_fit(x, y, 1.0 / y)
    relative = (a + b * x - y) / y
    hops, share = (2 * (ranks - 1), 2 * (ranks - 1) / ranks) if ring else (1, 1.0)
    return Link(alpha_s=a / hops, beta_s_per_byte=b / share,
                ranks=ranks, points=len(x), rms_relative_error=float(np.sqrt(np.mean(relative ** 2))))


def fit_per_worker(workers: Sequence[int], values: Sequence[float]) -> Tuple[float, float]:
    """(c, d) >= 0 of v(W) = c + d/W through per-worker measurements (relative error);
    from one number of workers, v is taken as constant; from none, zero."""
    w, v = np.asarray(workers, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(w) == 0:
        return 0.0, 0.0
    if len(set(workers)) < 2:
        return float(np.mean(v)), 0.0
    return nonnegative_fit(1.0 / w, v, 1.0 / np.maximum(np.abs(v), 1e-30))


def ring_s(nbytes: float, ranks: int, link: Link) -> float:
    """Seconds of a ring allreduce of ``nbytes`` on ``ranks`` ranks: 2(N-1)*alpha + 2(N-1)/N * n*beta
    (across nodes ``link`` is the between-node one: every ring step waits for a node crossing)."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * link.alpha_s + 2 * (ranks - 1) / ranks * nbytes * link.beta_s_per_byte


def hierarchical_s(nbytes: float, nodes: int, per_node: int, within: Link, between: Link) -> float:
    """Seconds of a hierarchical allreduce (modelled, not run): node-local binomial reduce and
    broadcast, 2*ceil(log2 P)*(alpha_i + n*beta_i), around a ring among the M node leaders."""
    local = 2 * math.ceil(math.log2(per_node)) * (within.alpha_s + nbytes * within.beta_s_per_byte) \
        if per_node > 1 else 0.0
    return local + ring_s(nbytes, nodes, between)


def ring_step_s(costs: StepCosts, link: Link, ranks: int) -> float:
    """Predicted seconds per ring step on ``ranks`` ranks (every rank a worker)."""
    return costs.grad_s(ranks) + costs.apply_s + ring_s(costs.ring_bytes, ranks, link)


def ps_step_s(costs: StepCosts, link: Link, ranks: int, servers: int) -> float:
    """Predicted seconds per BSP parameter-server step: ``servers`` K, N-K workers."""
    workers = ranks - servers
    if not 1 <= servers < ranks:
        raise ValueError(f"a parameter server needs 1 <= K < N, got K={servers}, N={ranks}")
    m = costs.ps_bytes(workers)
    worker_side = servers * link.alpha_s + m * link.beta_s_per_byte
    server_side = workers * link.alpha_s + workers * m / servers * link.beta_s_per_byte
    touched = min(1.0, workers * m / costs.ring_bytes) if costs.ring_bytes > 0 else 1.0
    return costs.grad_s(workers) + 2 * max(worker_side, server_side) + costs.apply_s * touched / servers


def best_servers(costs: StepCosts, link: Link, ranks: int) -> Tuple[int, float]:
    """The number of servers (1, 2, 4, ... below N, at most ``useful_servers``) with the
    fastest PS step, and its time."""
    choices = [1 << k for k in range(max(1, ranks).bit_length())
               if (1 << k) < ranks and (1 << k) <= costs.useful_servers()] or [1]
    return min(((k, ps_step_s(costs, link, ranks, k)) for k in choices), key=lambda pair: pair[1])


@dataclass(frozen=True)
class Prediction:
    """Both topologies at one number of ranks: time per step, samples/s, efficiency."""

    ranks: int
    ring_step_s: float
    ring_samples_per_s: float
    ring_efficiency: float
    ps_servers: int
    ps_step_s: float
    ps_samples_per_s: float
    ps_efficiency: float
    ps1_step_s: float

    @property
    def winner(self) -> str:
        return "ring" if self.ring_step_s <= self.ps_step_s else "ps"

    def as_dict(self) -> Dict[str, object]:
        return {**asdict(self), "winner": self.winner}


def predict(costs: StepCosts, link: Link, ranks: Sequence[int]) -> List[Prediction]:
    """Ring and the best PS layout at each number of ranks (at least 2)."""
    single = costs.batch / ring_step_s(costs, link, 1)
    rows = []
    for n in ranks:
        ring = ring_step_s(costs, link, n)
        servers, ps = best_servers(costs, link, n)
        ring_rate = costs.global_batch(n) / ring
        ps_rate = costs.global_batch(n - servers) / ps
        rows.append(Prediction(n, ring, ring_rate, ring_rate / (n * single), servers, ps, ps_rate,
                               ps_rate / (n * single), ps_step_s(costs, link, n, 1)))
    return rows


def recommend(rows: Sequence[Prediction], model_bytes: float) -> str:
    """One or two sentences: which topology is predicted faster over which range of ranks."""
    if not rows:
        return "no prediction: no rank counts given"
    spans: List[List[Prediction]] = []
    for row in rows:
        if spans and spans[-1][-1].winner == row.winner:
            spans[-1].append(row)
        else:
            spans.append([row])
    parts = []
    for span in spans:
        last = span[-1]
        layouts = sorted({row.ps_servers for row in span})
        servers = f"K={layouts[0]}" if len(layouts) == 1 else f"K from {layouts[0]} to {layouts[-1]} servers"
        name = "ring AllReduce" if last.winner == "ring" else f"a parameter server ({servers})"
        where = f"{span[0].ranks} to {last.ranks} ranks" if len(span) > 1 else f"{last.ranks} ranks"
        slower = last.ps_step_s if last.winner == "ring" else last.ring_step_s
        faster = min(last.ring_step_s, last.ps_step_s)
        parts.append(f"{name} at {where} (at {last.ranks}: {faster * 1e3:.3g} ms/step, "
                     f"{slower / faster:.2f}x faster than the other)")
    return (f"Recommendation for this model ({model_bytes / 2**20:.3g} MiB allreduced per step): "
            + "; ".join(parts) + ".")


def predict_nodes(costs: StepCosts, within: Link, between: Link, per_node: int,
                  nodes: Sequence[int]) -> List[Dict[str, Any]]:
    """Seconds per step and samples/s at M nodes (at least 2) of ``per_node`` ranks, N = M*P:
    the flat ring and the hierarchical allreduce, and the best PS over the between-node link
    (a worker's servers are almost all on other nodes); compute g(N) + t_apply as in ``predict``."""
    rows = []
    for m in nodes:
        n = m * per_node
        compute = costs.grad_s(n) + costs.apply_s
        servers, ps = best_servers(costs, between, n)
        ring = ring_step_s(costs, between, n)
        hierarchical = compute + hierarchical_s(costs.ring_bytes, m, per_node, within, between)
        steps = {"ring": ring, "hierarchical": hierarchical, "ps": ps}
        rows.append({"nodes": m, "ranks": n, "ring_step_s": ring, "hierarchical_step_s": hierarchical,
                     "ps_servers": servers, "ps_step_s": ps,
                     "ring_samples_per_s": costs.global_batch(n) / ring,
                     "hierarchical_samples_per_s": costs.global_batch(n) / hierarchical,
                     "ps_samples_per_s": costs.global_batch(n - servers) / ps,
                     "fastest": min(steps, key=lambda name: steps[name])})
    return rows
