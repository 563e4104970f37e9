"""Input pipeline alone: batches/sec that hvd_mnist's TFRecord reader (train_dataset) delivers to one rank.

Reads rank 0's shard of a 2-rank job (the same shard, shuffle, decode and prefetch a training rank gets)
and does nothing with the batches; reports examples/sec for that one rank.
"""

from __future__ import annotations

import argparse

from common import StepTimer, write_throughput

from hvd_mnist.data.pipeline import train_dataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", nargs="+", required=True)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=300, help="batches, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=60)
    parser.add_argument("--ranks", type=int, default=2, help="the job size whose rank-0 shard is read")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    timer = StepTimer(args.warmup_steps)
    dataset = train_dataset(args.records, args.batch_size, rank=0, size=args.ranks, seed=0)
    for images, _labels in dataset.take(args.steps):
        images.shape  # noqa: B018  (the batch is materialized; nothing else is done with it)
        timer.tick()
    write_throughput(args.out, timer, args.batch_size, shard_of=args.ranks)


if __name__ == "__main__":
    main()
