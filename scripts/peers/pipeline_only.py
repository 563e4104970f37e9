"""Input pipeline alone: batches/sec that hvd_mnist's input pipeline (train_dataset) delivers to one rank.

Reads the TFRecords into memory as a rank does at start-up (every record checked; its seconds are reported
as load_seconds), then draws rank 0's shuffled batches of a 2-rank job and does nothing with them;
reports examples/sec for that one rank.
"""

from __future__ import annotations

import argparse
import time

from common import StepTimer, write_throughput

from hvd_mnist.data.pipeline import train_dataset
from hvd_mnist.data.records import read_records


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
    started = time.perf_counter()
    split = read_records(args.records)
    load_seconds = time.perf_counter() - started
    timer = StepTimer(args.warmup_steps)
    for images, _labels in train_dataset(split, args.batch_size, rank=0, size=args.ranks, seed=0).take(args.steps):
        images.shape  # noqa: B018  (the batch is materialized; nothing else is done with it)
        timer.tick()
    write_throughput(args.out, timer, args.batch_size, shard_of=args.ranks, load_seconds=load_seconds,
                     examples_loaded=len(split))


if __name__ == "__main__":
    main()
