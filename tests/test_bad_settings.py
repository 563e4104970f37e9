"""Every setting against the same class of bad value (zero, negative, NaN, infinity, huge, empty, a directory
where a file belongs), as a flag and as a --config key: exit 2, one line naming the flag or the key and its
file, no traceback, no run directory. Through the real command line, in subprocesses run a few at a time."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import TIMEOUT, launcher_env

HERE = Path(__file__).resolve().parent
BINARY_FILE = Path(sys.executable).resolve()  # bytes that are no UTF-8 text, let alone TOML

# (flag, value as typed on the command line, value as written in TOML or None where only the flag applies,
#  what the one line must say)
CASES = [
    ("--lr", "nan", "nan", "--lr must be a finite number, got nan"),
    ("--lr", "inf", "inf", "--lr must be a finite number, got inf"),
    ("--lr", "-inf", "-inf", "--lr must be a finite number"),
    ("--lr", "0", "0.0", "--lr must be positive"),
    ("--lr", "-0.1", "-0.1", "--lr must be positive"),
    ("--lr", "1e300", "1e300", "--lr is out of range"),
    ("--lr-decay", "nan", "nan", "--lr-decay must be a finite number"),
    ("--lr-decay", "0", "0.0", "--lr-decay must be in (0, 1]"),
    ("--lr-decay", "1.5", "1.5", "--lr-decay must be in (0, 1]"),
    ("--ema-decay", "nan", "nan", "--ema-decay must be a finite number"),
    ("--ema-decay", "-1", "-1.0", "--ema-decay must be in (0, 1]"),
    ("--l2", "nan", "nan", "--l2 must be a finite number"),
    ("--l2", "-1", "-1.0", "--l2 must not be negative"),
    ("--loss-scale", "inf", "inf", "--loss-scale must be a finite number"),
    ("--loss-scale", "0", "0.0", "--loss-scale must be in (0, 16777216]"),
    ("--loss-scale", "1e9", "1e9", "--loss-scale must be in (0, 16777216]"),
    ("--collective-timeout", "nan", "nan", "--collective-timeout must be a finite number"),
    ("--collective-timeout", "inf", "inf", "--collective-timeout must be a finite number"),
    ("--collective-timeout", "-1", "-1.0", "--collective-timeout must not be negative"),
    ("--collective-timeout", "1e7", "1e7", "--collective-timeout must be at most 86400 s"),
    ("--target-accuracy", "nan", "nan", "--target-accuracy must be a finite number"),
    ("--target-accuracy", "0", "0.0", "--target-accuracy must be in (0, 1]"),
    ("--target-accuracy", "1.5", "1.5", "--target-accuracy must be in (0, 1]"),
    ("--batch-size", "0", "0", "--batch-size must be positive"),
    ("--batch-size", "-5", "-5", "--batch-size must be positive"),
    ("--batch-size", "3000000000", "3000000000", "--batch-size is out of range"),
    ("--accumulate", "0", "0", "--accumulate must be positive"),
    ("--steps", "0", "0", "--steps must be positive"),
    ("--steps", "100000000000000000000", "100000000000000000000", "--steps is out of range"),
    ("--decay-examples", "0", "0", "--decay-examples must be positive"),
    ("--warmup-steps", "-1", "-1", "--warmup-steps must not be negative"),
    ("--seed", "-1", "-1", "--seed must not be negative"),
    ("--eval-every", "-1", "-1", "--eval-every must not be negative"),
    ("--validation-size", "0", "0", "--validation-size must be positive"),
    ("--log-every", "0", "0", "--log-every must be positive"),
    ("--summary-every", "0", "0", "--summary-every must be positive"),
    ("--histogram-every", "-1", "-1", "--histogram-every must be positive"),
    ("--checkpoint-every", "0", "0", "--checkpoint-every must be positive"),
    ("--keep-checkpoints", "0", "0", "--keep-checkpoints must be positive"),
    ("--eval-batch-size", "0", "0", "--eval-batch-size must be positive"),
    ("--commit-every", "0", "0", "--commit-every must be positive"),
    ("--metrics-port", "0", "0", "--metrics-port must be a port number"),
    ("--metrics-port", "70000", "70000", "--metrics-port must be a port number"),
    ("--metrics-address", "", '""', "--metrics-address must be an IP address"),
    ("--metrics-address", "example.invalid", '"example.invalid"', "--metrics-address must be an IP address"),
    ("--mlflow", "", '""', "--mlflow must not be empty"),
    ("--model", "", '""', "--model"),
    ("--dataset", "", '""', "--dataset"),
    ("--export", "", '""', "--export"),
    ("--data-dir", "", '""', "--data-dir"),
    ("--data-dir", str(BINARY_FILE), f'"{BINARY_FILE}"', "data directory is a file"),
    ("--output-dir", "", '""', "--output-dir"),
    ("--output-dir", str(BINARY_FILE / "run"), f'"{BINARY_FILE / "run"}"', "cannot write to the output directory"),
    ("--resume-from", "", '""', "--resume-from"),
    ("--train-records", "", '[""]', "--train-records must not name an empty file"),
    ("--train-records", str(HERE), f'["{HERE}"]', "is a directory, not a TFRecord file"),
    ("--config", str(HERE), None, "Is a directory"),
    ("--config", str(BINARY_FILE), None, "not valid TOML: not UTF-8 text"),
    ("--batch-size", "100000000", "100000000", "is more than a rank's share of the training data: 4000 examples"),
    ("--accumulate", "5", "5", "--batch-size 1000 x --accumulate 5 = 5000 examples a step is more than a rank's"),
    ("--batch-size", "60000", "60000", "GiB for one step's activations"),
]
# What else the cases above need to reach their check (a big batch on enough data for the memory check).
CONTEXT = {"--accumulate": ["--batch-size", "1000"],
           "--batch-size": ["--model", "lenet5", "--dataset", "fashion_mnist"]}
IDS = [f"{flag[2:]}={value or 'empty'}"[:60] for flag, value, _, _ in CASES]


def context(flag: str, value: str) -> list[str]:
    return CONTEXT[flag] if flag in CONTEXT and value in ("5", "60000") else []


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvd_mnist", *args], capture_output=True, text=True,
                          env=launcher_env(), cwd=cwd, timeout=TIMEOUT)


def check(proc: subprocess.CompletedProcess, expected: str, run_dir: Path, where: str) -> list[str]:
    """What is wrong with the way a bad setting was refused (nothing, if it was refused as it should be):
    `expected` must be in its one line, or, for a key, the file and the key that the line names."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    problems = []
    if proc.returncode != 2:
        problems.append(f"exit {proc.returncode}")
    if len(lines) != 1 or not lines[0].startswith("hvd-mnist: error: ") or expected not in lines[0]:
        problems.append(f"stderr {lines[-5:]}")
    if "Traceback" in proc.stderr + proc.stdout:
        problems.append("a traceback")
    if run_dir.exists():
        problems.append(f"{run_dir} was made")
    return [f"{where}: {problem}" for problem in problems]


@pytest.mark.parametrize(("flag", "value", "toml", "expected"), CASES, ids=IDS)
def test_bad_setting_is_refused_as_a_flag_and_as_a_key(tmp_path, flag, value, toml, expected):
    run_dir = tmp_path / "run"
    output = [] if flag == "--output-dir" else ["--output-dir", str(run_dir)]
    config = tmp_path / "bad.toml"
    jobs = {"flag": [*context(flag, value), f"{flag}={value}", *output]}
    if toml is not None:
        config.write_text(f"{flag[2:]} = {toml}\n")
        jobs["key"] = [*context(flag, value), "--config", str(config), *output]
    with ThreadPoolExecutor(len(jobs)) as pool:
        procs = dict(zip(jobs, pool.map(lambda args: run(args, tmp_path), jobs.values()), strict=True))
    problems = check(procs["flag"], expected, run_dir, "as a flag")
    if toml is not None:
        # A line that names the flag names the key and its file when the value came from the file.
        names_key = f"{config}: key '{flag[2:]}'"
        must_name = flag in procs["flag"].stderr
        problems += check(procs["key"], names_key if must_name else expected, run_dir, "as a key")
    assert problems == []


def test_the_table_covers_every_setting():
    """A setting added to TrainConfig without a bad-value case here fails this test."""
    import dataclasses

    from hvd_mnist.config import TrainConfig

    untested = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)} - {c[0] for c in CASES}
    flags_only = {"--shuffle", "--bind-cpus", "--scale-lr", "--keep-best", "--resume", "--overwrite",
                  "--mixed-precision", "--fp16-allreduce", "--horovod-timeline", "--elastic", "--keep-global-batch",
                  "--test-records"}  # true/false switches, and a list checked as --train-records is
    assert untested - flags_only == set()
