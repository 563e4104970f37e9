"""Runs kept in files: --config TOML under the flags, --print-config, and a run directory's config.toml that
reruns its experiment."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from helpers import read_metrics, run_cli, run_trainer

from hvd_mnist.cli import parse_config
from hvd_mnist.config import TrainConfig
from hvd_mnist.config_file import LAUNCH_ONLY, experiment_toml, to_toml
from hvd_mnist.errors import UserError


def toml_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_each_layer_overrides_the_one_before(tmp_path):
    """Defaults, then --classic, then the file, then the flags on the command line."""
    path = toml_file(tmp_path, 'lr = 0.05\nbatch-size = 50\nmodel = "lenet5"\ntrain-records = ["a", "b"]\n')
    config = parse_config(["--config", str(path), "--batch-size", "20", "--classic"])
    assert (config.lr, config.batch_size, config.model, config.train_records) == (0.05, 20, "lenet5", ["a", "b"])
    assert config.steps == TrainConfig().steps  # untouched by both
    assert parse_config(["--classic"]).lr == 0.001 and parse_config(["--config", str(path), "--lr", "0.2"]).lr == 0.2


def test_every_field_survives_the_trip_through_toml_and_the_parser(tmp_path):
    """A configuration unlike the defaults in every field, printed as TOML and read back with --config."""
    changed = TrainConfig(
        dataset="fashion_mnist", data_dir=Path("d ir/ü"), train_records=['x"y.tfrecords'], test_records=["t"],
        validation_size=7, model="lenet5", batch_size=3, accumulate=2, steps=9, lr=1e-05, lr_decay=0.5,
        decay_examples=11, scale_lr=True, warmup_steps=0, l2=0.0, ema_decay=0.9, seed=4, shuffle=False,
        eval_every=5, target_accuracy=0.5, keep_best=True, output_dir=Path("out"), log_every=2, summary_every=3,
        histogram_every=4, checkpoint_every=6, keep_checkpoints=1, export="best", metrics_port=9100,
        metrics_address="127.0.0.1", mlflow="http://tracking:5000", eval_batch_size=8, resume=True,
        resume_from=None, overwrite=False, mixed_precision=True, loss_scale=64.0, fp16_allreduce=True,
        bind_cpus=False, collective_timeout=0.0, horovod_timeline=True, elastic=True, commit_every=3,
        keep_global_batch=True)
    defaults = dataclasses.asdict(TrainConfig())
    unchanged = {name for name, value in dataclasses.asdict(changed).items() if value == defaults[name]}
    assert unchanged <= {"resume_from", "overwrite"}, unchanged  # the test covers every field
    path = toml_file(tmp_path, to_toml(changed))
    assert parse_config(["--config", str(path)]) == changed


def test_print_config_prints_the_effective_configuration(tmp_path):
    path = toml_file(tmp_path, "steps = 7\nlog-every = 1\n")
    proc = run_cli("--config", str(path), "--lr", "0.3", "--print-config")
    assert proc.returncode == 0 and proc.stderr == ""
    printed = tomllib.loads(proc.stdout)
    assert (printed["steps"], printed["log-every"], printed["lr"], printed["batch-size"]) == (7, 1, 0.3, 100)
    assert parse_config(["--config", str(toml_file(tmp_path, proc.stdout))]) == parse_config(
        ["--config", str(path), "--lr", "0.3"])


def test_a_run_directory_keeps_the_experiment_not_the_launch():
    config = TrainConfig(output_dir=Path("runs/a"), resume=True, steps=20)
    kept = tomllib.loads(experiment_toml(config))
    assert kept["steps"] == 20 and not {name.replace("_", "-") for name in LAUNCH_ONLY} & set(kept)


@pytest.mark.parametrize(("text", "message"), [
    ("batchsize = 5\n", "run.toml: unknown key 'batchsize' (did you mean 'batch-size'?)"),
    ('batch-size = "50"\n', "run.toml: key 'batch-size' must be an integer, got '50'"),
    ("batch-size = 5.0\n", "run.toml: key 'batch-size' must be an integer, got 5.0"),
    ("scale-lr = 1\n", "run.toml: key 'scale-lr' must be true or false, got 1"),
    ("lr = true\n", "run.toml: key 'lr' must be a number, got True"),
    ("train-records = \"a\"\n", "run.toml: key 'train-records' must be a list of strings, got 'a'"),
    ("data-dir = 3\n", "run.toml: key 'data-dir' must be a path (a non-empty string), got 3"),
    ("batch-size = 0\n", "run.toml: key 'batch-size': --batch-size must be positive, got 0"),
    ("lr-decay = 2.0\n", "run.toml: key 'lr-decay': --lr-decay must be in (0, 1], got 2.0"),
    ("steps = \n", "run.toml: not valid TOML"),
])
def test_a_bad_file_is_named_with_its_key(tmp_path, text, message):
    path = toml_file(tmp_path, text)
    with pytest.raises(UserError) as raised:
        parse_config(["--config", str(path)])
    assert message in str(raised.value)


def test_a_flag_can_correct_a_bad_value_of_the_file(tmp_path):
    path = toml_file(tmp_path, "batch-size = 0\n")
    assert parse_config(["--config", str(path), "--batch-size", "10"]).batch_size == 10


def test_a_bad_or_missing_file_is_one_line_and_exit_2(tmp_path):
    for path in (toml_file(tmp_path, "batch-size = 0\n"), tmp_path / "missing.toml"):
        proc = run_cli("--config", str(path))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("hvd-mnist: error: ")
        assert str(path) in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_run_is_rerun_from_its_config_toml(tmp_path):
    """Under horovodrun (which reads its command line, the trainer's flags too): run a's config.toml reruns
    it in b with bit-identical weights; b keeps the same experiment."""
    first, second = tmp_path / "a", tmp_path / "b"
    run_trainer("horovodrun", 2, "--steps", "40", "--batch-size", "50", "--lr", "0.05", "--log-every", "10",
                "--output-dir", str(first))
    run_trainer("horovodrun", 2, "--config", str(first / "config.toml"), "--output-dir", str(second))
    assert (second / "config.toml").read_text() == (first / "config.toml").read_text()
    ends = [read_metrics(run)[-1] for run in (first, second)]
    assert [end["step"] for end in ends] == [40, 40]
    assert ends[0]["weights_sha256"] == ends[1]["weights_sha256"]
