"""The package as others install it: extras that never put two TensorFlows in one environment, and a Horovod
built against another TensorFlow named at start-up in one line."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import horovod
from helpers import launcher_env

# A symbol that no TensorFlow defines: what a Horovod built against another TensorFlow's C++ ABI asks for.
STUB = "extern void _ZN10tensorflow20OpKernelFromAnotherTFEv(void);\nvoid hvd_stub(void) { " \
       "_ZN10tensorflow20OpKernelFromAnotherTFEv(); }\n"


def requirements(extra: str | None) -> dict[str, str]:
    """Name -> specifier of the installed hvd_mnist's requirements, plain (None) or of one extra."""
    found = {}
    for requirement in importlib.metadata.requires("hvd_mnist"):
        spec, _, marker = requirement.partition(";")
        if (extra is None and not marker) or (extra is not None and f'extra == "{extra}"' in marker):
            name = re.match(r"[A-Za-z0-9_.-]+", spec.strip())[0]
            found[name] = spec.strip()
    return found


def test_tensorflow_comes_from_exactly_one_extra():
    plain, cpu, gpu = requirements(None), requirements("cpu"), requirements("gpu")
    assert not [name for name in plain if name.startswith("tensorflow")], plain  # keeps the environment's own
    assert {"horovod", "mpi4py", "tensorboard"} <= plain.keys()
    assert cpu == {"tensorflow-cpu": "tensorflow-cpu==2.21.0"}
    assert list(gpu) == ["tensorflow"] and "and-cuda" in gpu["tensorflow"] and "==2.21.0" in gpu["tensorflow"]


def test_a_horovod_built_against_another_tensorflow_is_one_line_at_start_up(tmp_path):
    """This Horovod with its TensorFlow op library swapped for one that needs a symbol this TensorFlow lacks,
    first on the path: one line naming the cause and the fix, exit 1, no traceback, no run directory."""
    overlay = tmp_path / "site"
    package = Path(horovod.__file__).parent
    shutil.copytree(package, overlay / "horovod", ignore=shutil.ignore_patterns("__pycache__"))
    library = overlay / "horovod" / "tensorflow" / f"mpi_lib{sysconfig.get_config_var('EXT_SUFFIX')}"
    assert library.is_file(), library
    (tmp_path / "stub.c").write_text(STUB)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "stub.c")], check=True)
    proc = subprocess.run([sys.executable, "-m", "hvd_mnist", "--steps", "5", "--output-dir", str(tmp_path / "run")],
                          env={**launcher_env(), "PYTHONPATH": str(overlay)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("hvd-mnist: error: Horovod cannot load against the installed TensorFlow 2.21.0 (")
    assert "undefined symbol: _ZN10tensorflow20OpKernelFromAnotherTFEv" in lines[0]
    assert lines[0].endswith("build it against this TensorFlow with scripts/build_horovod.sh (docs/guide.md, Set-up)")
    assert not (tmp_path / "run").exists()
