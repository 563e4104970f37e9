"""Peer: PyTorch DistributedDataParallel with the Gloo backend, one worker per local process.

The process group meets through a file store beside the result file and Gloo talks over the loopback
interface only (GLOO_SOCKET_IFNAME=lo, set by the benchmark). Each worker holds its shard (every size-th
example from its rank) in memory, draws a fresh permutation per epoch, slices batches, and runs
forward, backward (DDP all-reduces the gradient buckets) and torch.optim.SGD. With --eval-every and
--target-accuracy it stops once the validation accuracy (its weights as they are: it keeps no moving average)
reaches the target (common.TargetRace; the counts are summed with dist.all_reduce).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from common import (
    HIDDEN,
    INIT_STDDEV,
    PHASES,
    LocalWorld,
    StepTimer,
    TargetRace,
    load_npz,
    parse_args,
    write_throughput,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def build_mlp(seed: int = 0) -> nn.Module:
    """784-500-10 ReLU with truncated-normal weights (stddev 0.1, cut at 2 stddev) and zero biases."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(784, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
    for layer in (model[0], model[2]):
        nn.init.trunc_normal_(layer.weight, std=INIT_STDDEV, a=-2 * INIT_STDDEV, b=2 * INIT_STDDEV)
        nn.init.zeros_(layer.bias)
    return model


def batches(images: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int):
    """Endless shuffled batches of float images in [0, 1] and int64 labels."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            index = order[start:start + batch_size]
            yield images[index].float().div_(255.0), labels[index]


def num_correct(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> int:
    """Correct argmax predictions on uint8 images, in one forward pass without the autograd graph."""
    with torch.no_grad():
        logits = model(torch.from_numpy(images).float().div_(255.0))
    return int((logits.argmax(dim=1) == torch.from_numpy(labels)).sum())


def test_accuracy(model: nn.Module, path: str) -> float:
    images, labels = load_npz(path)
    return num_correct(model, images, labels) / len(labels)


def sum_over_ranks(values: list[float]) -> list[float]:
    total = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(total)
    return total.tolist()


def main() -> None:
    args = parse_args(__doc__)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = LocalWorld.from_env()
    store = Path(args.out).resolve().parent / "torch_store"
    dist.init_process_group("gloo", init_method=f"file://{store}",
                            rank=world.rank, world_size=world.size)
    PHASES.done("rendezvous_done")
    images, labels = load_npz(args.data)
    shard = (torch.from_numpy(images[world.rank::world.size].copy()),
             torch.from_numpy(labels[world.rank::world.size].copy()))
    model = DistributedDataParallel(build_mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    timer = StepTimer(args.warmup_steps)
    race = TargetRace.from_args(args, world.rank, world.size)
    correct = functools.partial(num_correct, model.module)
    stream = batches(*shard, args.batch_size, world.rank)
    PHASES.done("data_ready")
    for _ in range(args.steps):
        batch_images, batch_labels = next(stream)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch_images), batch_labels)
        loss.backward()
        optimizer.step()
        timer.tick()
        if race.due(timer.steps) and race.reaches_target(timer.steps, correct, sum_over_ranks):
            break
    float(loss.detach())
    PHASES.done("trained")
    if world.rank == 0:
        accuracy = test_accuracy(model.module, args.test_data) if args.test_data else None
        write_throughput(args.out, timer, args.batch_size * world.size, race, test_accuracy=accuracy,
                         workers=world.size, torch_threads=torch.get_num_threads())
    dist.barrier()  # rank 1 must not tear Gloo down while rank 0 still evaluates (seen: abort at exit)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Even so, on a loaded machine a rank could still abort in the interpreter's teardown ("terminate called
    # without an active exception", exit 250, after its work and result were done: seen in a full suite run
    # while the container image built). Skip the teardown, as hvd_mnist's own quick exit does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
