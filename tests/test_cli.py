"""The command line: --help, flag validation and one-line errors with a non-zero exit."""

import pytest
from conftest import run_cli

from hvd_mnist.cli import build_parser
from hvd_mnist.config import TrainConfig
from hvd_mnist.errors import UserError


def test_defaults_are_the_classic_hyperparameters():
    config = TrainConfig(**vars(build_parser().parse_args([])))
    assert (config.batch_size, config.steps, config.lr, config.lr_decay) == (100, 1000, 0.001, 0.99)
    assert (config.l2, config.ema_decay, config.model, config.decay_examples) == (1e-4, 0.99, "mlp", 60000)
    assert config.decay_steps(world_size=2) == 300.0


def test_help_lists_the_flags():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for flag in ("--data-dir", "--train-records", "--scale-lr", "--resume", "--checkpoint-every", "--model"):
        assert flag in proc.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--steps", "-5"], "--steps must be positive"),
        (["--lr", "-0.1"], "--lr must be positive"),
        (["--ema-decay", "1.5"], "--ema-decay must be in (0, 1]"),
        (["--resume"], "--resume needs --output-dir"),
    ],
)
def test_bad_flags_are_one_line_errors(flags, message):
    with pytest.raises(UserError, match=message.replace("(", "\\(").replace(")", "\\)")):
        TrainConfig(**vars(build_parser().parse_args(flags))).validate()


def test_unknown_model_is_rejected_by_argparse():
    proc = run_cli("--model", "resnet")
    assert proc.returncode == 2 and "invalid choice: 'resnet'" in proc.stderr
