"""The house's rules: hvd_mnist.runtime (what keeps a run alive) never imports hvd_mnist.train (what trains), and
train reaches runtime only through its one door, the supervisor module (the Supervisor, and the plain values it
names in `__all__`)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from helpers import BIN, ROOT

RUNTIME = ROOT / "hvd_mnist" / "runtime"
TRAIN = ROOT / "hvd_mnist" / "train"
DOOR = {"hvd_mnist.runtime.supervisor"}


def imported_modules(source: str, path: Path) -> set[str]:
    """Every module that `source` (the text of the file at `path`) imports, at any depth, as absolute names."""
    names = set()
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the file's package
                package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-node.level])
                base = f"{package}.{base}" if base else package
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return names


def imports_train(names: set[str]) -> list[str]:
    return sorted(name for name in names if name == "hvd_mnist.train" or name.startswith("hvd_mnist.train."))


def test_runtime_never_imports_train():
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) > 5, f"no runtime modules found under {RUNTIME}"
    offenders = {str(path.relative_to(ROOT)): imports_train(imported_modules(path.read_text(), path))
                 for path in files}
    assert {path: names for path, names in offenders.items() if names} == {}


def runtime_modules(names: set[str]) -> set[str]:
    """The runtime modules among `names`, at any depth (a name imported from the door counts as the door)."""
    return {next((door for door in DOOR if name.startswith(f"{door}.")), name) for name in names
            if name.startswith("hvd_mnist.runtime.")}


def test_train_reaches_runtime_only_through_its_door():
    files = sorted(TRAIN.rglob("*.py"))
    assert len(files) > 5, f"no training modules found under {TRAIN}"
    used = {str(path.relative_to(ROOT)): runtime_modules(imported_modules(path.read_text(), path)) for path in files}
    assert "hvd_mnist.runtime.supervisor" in set().union(*used.values())
    assert {path: sorted(modules - DOOR) for path, modules in used.items() if modules - DOOR} == {}


def test_the_door_rule_sees_a_way_around_the_supervisor():
    names = imported_modules("from hvd_mnist.runtime.health.heartbeats import Heartbeats", TRAIN / "probe.py")
    assert runtime_modules(names) - DOOR == {"hvd_mnist.runtime.health.heartbeats",
                                             "hvd_mnist.runtime.health.heartbeats.Heartbeats"}


@pytest.mark.parametrize("source", ["import hvd_mnist.train.loop", "from hvd_mnist.train import replica",
                                    "from ..train.loop import TrainingLoop",
                                    "def f():\n    from hvd_mnist import train\n"])
def test_the_rule_sees_every_kind_of_import(source):
    """The checker can fail: plain, from-, relative and function-level imports of the training room are seen."""
    assert imports_train(imported_modules(source, RUNTIME / "probe.py"))


def test_the_code_is_ruff_clean():
    """The style rules of pyproject.toml hold for the package, the scripts and the tests."""
    proc = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "hvd_mnist", "scripts", "tests"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
