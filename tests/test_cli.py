"""The command line: --help, defaults, --classic, flag validation and one-line errors with a non-zero exit."""

import contextlib
import logging
import os
import re
import subprocess
import threading

import pytest
from helpers import BIN, run_cli

from hvd_mnist.cli import build_parser, parse_config
from hvd_mnist.errors import UserError
from hvd_mnist.launching import HOROVODRUN
from hvd_mnist.train.plan import BatchPlan
from hvd_mnist.train.telemetry.reporting import ConsoleHandler


def test_defaults_learn_and_classic_restores_the_tower_script():
    config = parse_config([])
    assert (config.batch_size, config.steps, config.lr, config.lr_decay) == (100, 1000, 0.1, 0.99)
    assert (config.l2, config.ema_decay, config.model, config.decay_examples) == (1e-4, 0.99, "mlp", 60000)
    assert BatchPlan.of(config, world_size=2).decay_steps == 300.0
    assert parse_config(["--classic"]).lr == 0.001
    assert parse_config(["--classic", "--lr", "0.05"]).lr == 0.05  # an explicit flag still wins
    assert not config.evaluates and parse_config(["--eval-every", "100"]).evaluates


def test_accumulation_multiplies_the_global_batch():
    config = parse_config(["--batch-size", "50", "--accumulate", "4"])
    plan = BatchPlan.of(config, world_size=2)
    assert (plan.global_batch, plan.micro_batches, plan.decay_steps) == (400, 4, 150.0)
    assert BatchPlan.of(config, world_size=1).across_ranks is False and plan.across_ranks
    keep = parse_config(["--batch-size", "50", "--elastic", "--output-dir", "x", "--keep-global-batch"])
    assert BatchPlan.of(keep, world_size=3, target_global_batch=400).micro_batches == 3  # 450 is nearest to 400
    assert BatchPlan.of(keep, world_size=16, target_global_batch=400).micro_batches == 1
    assert BatchPlan.of(keep, world_size=16).micro_batches == 1  # no target yet: the first start sets it


def test_help_lists_the_flags():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for flag in ("--data-dir", "--train-records", "--scale-lr", "--resume", "--checkpoint-every", "--model",
                 "--eval-every", "--target-accuracy", "--keep-best", "--accumulate", "--classic", "--horovod-timeline"):
        assert flag in proc.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--steps", "-5"], "--steps must be positive"),
        (["--accumulate", "0"], "--accumulate must be positive"),
        (["--lr", "-0.1"], "--lr must be positive"),
        (["--ema-decay", "1.5"], "--ema-decay must be in (0, 1]"),
        (["--resume"], "--resume needs --output-dir"),
        (["--eval-every", "-1"], "--eval-every must not be negative"),
        (["--target-accuracy", "0.9"], "--target-accuracy and --keep-best need --eval-every"),
        (["--eval-every", "10", "--target-accuracy", "1.5"], "--target-accuracy must be in (0, 1]"),
        (["--export", "best"], "--export best needs --keep-best"),
        (["--eval-every", "10", "--validation-size", "0"], "--validation-size must be positive"),
        (["--keep-global-batch"], "--keep-global-batch is for --elastic runs"),
        (["--metrics-port", "70000"], "--metrics-port must be a port number (1-65535), got 70000"),
    ],
)
def test_bad_flags_are_one_line_errors(flags, message):
    with pytest.raises(UserError, match=message.replace("(", "\\(").replace(")", "\\)")):
        parse_config(flags).validate()


def test_an_unknown_model_is_one_line_naming_the_choices():
    proc = run_cli("--model", "resnet")
    assert proc.returncode == 2 and proc.stderr == ("hvd-mnist: error: unknown --model 'resnet'; choose one of mlp, "
                                                    "lenet5, or name a function of yours as MODULE:FUNCTION\n")


def test_no_flag_is_an_ambiguous_abbreviation_of_a_horovodrun_option():
    """horovodrun reads every option of its command line, the trainer's too: a flag of ours that starts two of
    its options (as --timeline would: --timeline-filename, --timeline-mark-cycles) stops the launch."""
    horovodrun_help = subprocess.run([str(HOROVODRUN), "--help"], capture_output=True, text=True,
                                     timeout=60).stdout
    theirs = set(re.findall(r"--[a-z][a-z0-9-]*", horovodrun_help))
    assert {"--timeline-filename", "--elastic-timeout", "--verbose"} <= theirs
    ours = {option for action in build_parser()._actions for option in action.option_strings if option[:2] == "--"}
    for option in ours:
        assert len({other for other in theirs if other.startswith(option) and other != option}) < 2, option


def test_tensorflow_and_horovod_are_imported_without_keras_or_matplotlib_which_stay_importable():
    # TensorFlow loads Keras eagerly, Horovod's SyncBatchNormalization needed it (build_horovod.sh's patch 8), and
    # Keras imports matplotlib.pyplot (0.45 s per rank): none of them is used by the built-in models.
    probe = ("import sys; from hvd_mnist.runtime.boot.startup import import_tensorflow_quietly, import_keras; "
             "import_tensorflow_quietly(); "
             "assert 'horovod.tensorflow' in sys.modules, sorted(sys.modules); "
             "assert not {'keras', 'matplotlib'} & set(sys.modules), sorted(sys.modules); "
             "import_keras(); assert 'keras' in sys.modules and 'matplotlib' not in sys.modules; "
             "import horovod.tensorflow as hvd; assert hvd.SyncBatchNormalization.__module__.startswith('horovod'); "
             "import matplotlib.pyplot")
    result = subprocess.run([str(BIN / "python"), "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_log_line_that_would_block_on_a_full_pipe_is_dropped_and_others_get_through():
    """mpirun stops reading its ranks' output once told to end the job and passes the SIGTERM on only later: a
    rank must not block on the full pipe, or it could never act on the signal."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 4096)
    os.set_blocking(write_end, True)  # as a rank's stderr is: a write to the full pipe would wait forever
    stream = os.fdopen(write_end, "w")
    handler = ConsoleHandler(stream)
    record = logging.LogRecord("hvd_mnist", logging.INFO, __file__, 1, "step %d", (10,), None)
    emitting = threading.Thread(target=lambda: [handler.emit(record) for _ in range(100)], daemon=True)
    emitting.start()
    emitting.join(timeout=5)
    assert not emitting.is_alive(), "a log line blocked on the full pipe"
    os.set_blocking(read_end, False)
    with contextlib.suppress(BlockingIOError):
        while os.read(read_end, 65536):  # the reader catches up: the pipe is empty again
            pass
    handler.emit(record)
    stream.flush()
    assert os.read(read_end, 100) == b"step 10\n"
    stream.close()
    os.close(read_end)
