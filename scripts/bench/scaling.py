"""A communication model of synchronous data parallelism over N ranks: allreduce time, step time, efficiency.

Why: every figure in docs/benchmark.md is 2 ranks on one machine. A user who outgrows it needs to know how a step
behaves when the gradient crosses a real network between N nodes, and what to change when it stops scaling. This
model predicts that from a few numbers (compute time per step, gradient bytes, the link's alpha and bandwidth); the
shaped-link measurements of issue 24 fit alpha and B and check the predictions (`fit_alpha_bandwidth`,
`predicted_vs_measured`). Pure Python and numpy, so the plan (`scripts/scaling_plan.py`) runs anywhere.

A ring allreduce of S bytes over N ranks is a reduce-scatter then an allgather: 2(N-1) messages per rank, each of
S/N bytes, so every rank's link carries 2(N-1)/N * S bytes each way:

    t = 2(N-1)/N * S/B + 2(N-1) * alpha

B is the bandwidth of one rank's link (ranks that share a link share its rate), alpha the per-message latency.
2(N-1)/N * S/t is what nccl-tests calls "bus bandwidth".
"""

from __future__ import annotations

import numpy as np

from hvd_mnist.model_registry import MODELS  # plain records: no TensorFlow

FLOAT32_BYTES = 4
FLOAT16_BYTES = 2  # what --fp16-allreduce (hvd.Compression.fp16) sends


def gradient_bytes(model: str, fp16: bool = False) -> int:
    """Bytes one rank puts into the allreduce per step: every parameter's gradient, halved by fp16 compression."""
    return MODELS[model].params * (FLOAT16_BYTES if fp16 else FLOAT32_BYTES)


def gbit_to_bytes_per_s(gbit_per_s: float) -> float:
    """Link rates are quoted in Gbit/s (10^9 bits); the model works in bytes per second."""
    return gbit_per_s * 1e9 / 8


def _check_link(n: int, size_bytes: float, bandwidth_bytes_per_s: float, alpha_s: float) -> None:
    if n < 1:
        raise ValueError(f"need at least one rank, got n={n}")
    if size_bytes < 0 or bandwidth_bytes_per_s <= 0 or alpha_s < 0:
        raise ValueError(f"need size >= 0, bandwidth > 0, alpha >= 0; got {size_bytes}, "
                         f"{bandwidth_bytes_per_s}, {alpha_s}")


def ring_allreduce_seconds(n: int, size_bytes: float, bandwidth_bytes_per_s: float, alpha_s: float) -> float:
    """2(N-1)/N * S/B + 2(N-1) * alpha: the ring's bandwidth term and its 2(N-1) message latencies; 0 for N = 1.

    The bandwidth term tends to 2S/B as N grows, so only the latency term keeps growing with N.
    """
    _check_link(n, size_bytes, bandwidth_bytes_per_s, alpha_s)
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * size_bytes / bandwidth_bytes_per_s + 2 * (n - 1) * alpha_s


def hierarchical_allreduce_seconds(n: int, size_bytes: float, bandwidth_bytes_per_s: float, alpha_s: float,
                                   ranks_per_node: int, intra_bandwidth_bytes_per_s: float, intra_alpha_s: float,
                                   shared_link: bool = False) -> float:
    """HOROVOD_HIERARCHICAL_ALLREDUCE: reduce-scatter inside each node, allreduce across nodes, allgather inside.

    With G ranks per node and M = N/G nodes, each rank allreduces its S/G shard across the M nodes, all G shards at
    once, so the inter-node ring has M members (2(M-1) latencies instead of 2(N-1)) and S/G bytes per rank. With a
    link of rate B per rank (the node's network capacity G*B) the inter-node bandwidth term falls by G too; with
    `shared_link` the G shards share one link of rate B and that term stays 2(M-1)/M * S/B: only alpha's part
    shrinks. The intra-node reduce-scatter plus allgather costs a ring allreduce of S over G on the node's own
    interconnect (NVLink, PCIe or shared memory).
    """
    if ranks_per_node < 1:
        raise ValueError(f"need ranks_per_node >= 1, got {ranks_per_node}")
    if n <= ranks_per_node:
        return ring_allreduce_seconds(n, size_bytes, intra_bandwidth_bytes_per_s, intra_alpha_s)
    if n % ranks_per_node:
        raise ValueError(f"n={n} is not a whole number of nodes of {ranks_per_node} ranks")
    nodes = n // ranks_per_node
    inter_bandwidth = bandwidth_bytes_per_s / ranks_per_node if shared_link else bandwidth_bytes_per_s
    intra = ring_allreduce_seconds(ranks_per_node, size_bytes, intra_bandwidth_bytes_per_s, intra_alpha_s)
    return intra + ring_allreduce_seconds(nodes, size_bytes / ranks_per_node, inter_bandwidth, alpha_s)


def _check_overlap(overlap: float) -> None:
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap is a fraction in [0, 1], got {overlap}")


def step_seconds(n: int, compute_s: float, size_bytes: float, bandwidth_bytes_per_s: float, alpha_s: float,
                 overlap: float = 0.0) -> float:
    """One synchronous step: compute + (1 - overlap) * allreduce.

    `overlap` is the fraction of the allreduce hidden behind the backward pass. 0, the default, is what Horovod does
    for this repo's models: a few small layers whose gradients are all ready at once, so the fused allreduce starts
    after the backward pass ends and the step waits for all of it.
    """
    _check_overlap(overlap)
    return compute_s + (1.0 - overlap) * ring_allreduce_seconds(n, size_bytes, bandwidth_bytes_per_s, alpha_s)


def efficiency(n: int, compute_s: float, size_bytes: float, bandwidth_bytes_per_s: float, alpha_s: float,
               overlap: float = 0.0) -> float:
    """compute / step time: weak scaling, the per-worker batch fixed, so N workers do N times one worker's work.

    Throughput(N) / (N * throughput(1)) reduces to this because one worker's step is the compute alone.
    """
    if compute_s <= 0:
        raise ValueError(f"compute time must be positive, got {compute_s}")
    return compute_s / step_seconds(n, compute_s, size_bytes, bandwidth_bytes_per_s, alpha_s, overlap)


def compute_for_efficiency(target: float, exposed_comm_s: float) -> float:
    """The compute per step at which a step with this much unhidden communication reaches `target` efficiency.

    From c / (c + t) = e: c = e / (1 - e) * t (9 t for 0.9). Useful where the compute time is unknown (GPUs).
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target efficiency must lie in (0, 1), got {target}")
    return target / (1.0 - target) * exposed_comm_s


def _design(samples: list[tuple[int, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    rows, seconds = [], []
    for n, size_bytes, t in samples:
        if n < 2 or size_bytes <= 0 or t <= 0:
            raise ValueError(f"each sample needs n >= 2, size > 0 and seconds > 0; got {(n, size_bytes, t)}")
        rows.append((2 * (n - 1) / n * size_bytes, 2 * (n - 1)))
        seconds.append(t)
    return np.array(rows, dtype=float), np.array(seconds, dtype=float)


def fit_alpha_bandwidth(samples: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Least squares of t = a * 2(N-1)/N * S + b * 2(N-1) over (n, size_bytes, seconds); returns (alpha, B) = (b, 1/a).

    Why: alpha and B of a link are not quoted anywhere trustworthy, so they are fitted from measured allreduces of
    one link rate and then used to predict everything else (other N, fp16, full steps).

    Needs samples at two or more (N, S) points that are not multiples of each other (two N, or two sizes), else
    alpha and B cannot be told apart. Raises ValueError on a non-physical fit: a negative (or infinite) bandwidth.
    When alpha comes out negative it is clamped to 0 and B refitted alone: on a bridge between namespaces alpha is
    tens of microseconds against transfers of tens of milliseconds, at the noise level of the fit, and a negative
    latency means nothing. A clearly negative alpha would instead say the times do not follow the model; the errors
    of `predicted_vs_measured` show that either way.
    """
    x, t = _design(samples)
    if len(t) < 2 or np.linalg.matrix_rank(x) < 2:
        raise ValueError("alpha and B need samples at two or more (N, size) points that are not proportional")
    (a, b), *_ = np.linalg.lstsq(x, t, rcond=None)
    if b < 0:
        b = 0.0
        a = float(x[:, 0] @ t / (x[:, 0] @ x[:, 0]))
    if a <= 0:
        raise ValueError(f"non-physical fit: 1/B = {a:.3g} s/byte, a negative or infinite bandwidth")
    return float(b), float(1.0 / a)


def predicted_vs_measured(samples: list[tuple[int, float, float]], alpha_s: float,
                          bandwidth_bytes_per_s: float) -> list[dict[str, float]]:
    """Each sample against the ring model: n, size_bytes, measured_s, predicted_s, relative_error (pred/meas - 1).

    Why: the issue's goal is every measured time within +-25% of the prediction; these rows are the report's table.
    """
    rows = []
    for n, size_bytes, measured in samples:
        predicted = ring_allreduce_seconds(n, size_bytes, bandwidth_bytes_per_s, alpha_s)
        rows.append({"n": n, "size_bytes": size_bytes, "measured_s": measured, "predicted_s": predicted,
                     "relative_error": predicted / measured - 1.0})
    return rows
