"""Runs kept in files: `--config FILE` (TOML, the flags' names as keys) and the TOML that `--print-config` prints
and every run directory keeps, so that `hvd-mnist --config runs/a/config.toml --output-dir runs/b` reruns a."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
import types
import typing
from pathlib import Path

from hvd_mnist.config import TrainConfig, flag
from hvd_mnist.errors import UserError

# How this launch started, not what the experiment is: left out of a run directory's config.toml, so that a
# rerun from it starts afresh wherever its --output-dir says.
LAUNCH_ONLY = ("output_dir", "resume", "resume_from", "overwrite")
FIELDS = {field.name: field for field in dataclasses.fields(TrainConfig)}
HINTS = typing.get_type_hints(TrainConfig)


def key(name: str) -> str:
    """The TOML key of a TrainConfig field: its flag without the dashes in front (`batch-size`)."""
    return flag(name)[2:]


def load(path: Path) -> dict[str, object]:
    """The TrainConfig fields set by the TOML file at `path`, checked key by key: UserError for an unreadable
    file, an unknown key or a value of the wrong type, naming the key and the file."""
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as err:
        raise UserError(f"--config {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"--config {path}: not valid TOML: {err}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"--config {path}: not valid TOML: not UTF-8 text (byte {err.start})") from None
    values = {}
    for name, value in table.items():
        field = name.replace("-", "_")
        if field not in FIELDS:
            close = difflib.get_close_matches(name, [key(known) for known in FIELDS], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"{path}: unknown key '{name}'{hint}")
        values[field] = _typed(field, value, f"{path}: key '{name}'")
    return values


def _typed(field: str, value: object, where: str) -> object:
    """`value` as the field's type (an int where a float is expected, a string for a path), or UserError."""
    expected = HINTS[field]
    if isinstance(expected, types.UnionType):  # `X | None`: TOML has no null, so a present key is an X
        expected = next(arg for arg in typing.get_args(expected) if arg is not type(None))
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif expected is Path:
        ok = isinstance(value, str) and bool(value.strip())  # Path("") would quietly mean the current directory
        value = Path(value) if ok else value
    elif typing.get_origin(expected) is list:
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise UserError(f"{where} must be {_describe(expected)}, got {value!r}")
    return value


def _describe(expected: object) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", Path: "a path (a non-empty string)",
             str: "a string"}
    return names.get(expected, "a list of strings")


def to_toml(config: TrainConfig, leave_out: tuple[str, ...] = ()) -> str:
    """The configuration as TOML, one `key = value` per field that has a value (TOML has no null)."""
    lines = []
    for name, value in dataclasses.asdict(config).items():
        if value is None or name in leave_out:
            continue
        lines.append(f"{key(name)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string (same escapes)


def changes(previous: dict[str, object], config: TrainConfig) -> dict[str, tuple[object, object]]:
    """{field: (its value in `previous`, its value now)} for every experiment field that differs."""
    return {name: (value, getattr(config, name)) for name, value in previous.items()
            if name not in LAUNCH_ONLY and not _same(getattr(config, name), value)}


def experiment_toml(config: TrainConfig) -> str:
    """What a run directory keeps: the experiment, without how this launch started (LAUNCH_ONLY)."""
    return to_toml(config, leave_out=LAUNCH_ONLY)


def validated(config: TrainConfig, from_file: dict[str, object], path: Path | None) -> TrainConfig:
    """`config` once it validates; a bad value that came from the file is named with its key and the file."""
    try:
        config.validate()
    except UserError as err:
        raise named(err, config, from_file, path) from None
    return config


def named(err: UserError, config: TrainConfig, from_file: dict[str, object], path: Path | None) -> UserError:
    """`err`, prefixed with the file and key it came from where the flag it names was set by the file."""
    keys = [name for name, value in from_file.items()
            if _same(getattr(config, name), value) and re.search(rf"{re.escape(flag(name))}(?![\w-])", str(err))]
    return UserError(f"{path}: key '{key(keys[0])}': {err}") if keys else err


def _same(setting: object, value: object) -> bool:
    """Whether the setting is still the file's value (NaN, which equals nothing, included)."""
    nan = isinstance(value, float) and math.isnan(value)
    return setting == value or (nan and isinstance(setting, float) and math.isnan(setting))
