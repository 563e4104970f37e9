"""Allreduce alone: Horovod averaging one float32 tensor the size of the MLP's gradient, on N ranks.

Run under `horovodrun --gloo` (Gloo) or `mpirun` (MPI). The allreduce sits in a tf.function as in the
trainer; reports seconds per call and the bandwidths (algorithm: bytes / time; bus: x 2(n-1)/n for a ring).
"""

from __future__ import annotations

import argparse

import horovod.tensorflow as hvd
import tensorflow as tf
from common import StepTimer, write_result

GRADIENT_VALUES = 784 * 500 + 500 + 500 * 10 + 10  # 397,510: the MLP's weights and biases


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300, help="warm-up included")
    parser.add_argument("--warmup-calls", type=int, default=60)
    parser.add_argument("--fp16", action="store_true", help="Horovod's fp16 compression (half the bytes sent)")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    values = tf.random.uniform([GRADIENT_VALUES], seed=hvd.rank())
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none

    @tf.function
    def average(tensor: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(tensor, op=hvd.Average, name="gradient", compression=compression)

    timer = StepTimer(args.warmup_calls)
    for _ in range(args.calls):
        result = average(values)
        timer.tick()
    float(result[0])
    calls, seconds = timer.timed()
    if hvd.rank() == 0:
        per_call = seconds / calls
        nbytes = GRADIENT_VALUES * (2 if args.fp16 else 4)
        write_result(args.out, sec_per_call=per_call, algbw_gbytes_per_sec=nbytes / per_call / 1e9,
                     busbw_gbytes_per_sec=nbytes / per_call / 1e9 * 2 * (hvd.size() - 1) / hvd.size(),
                     bytes=nbytes, ranks=hvd.size(), controller="mpi" if hvd.mpi_enabled() else "gloo")


if __name__ == "__main__":
    main()
