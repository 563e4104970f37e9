"""Helpers shared by the tests (fixtures stay in conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench.launching import BIN, launcher_env  # noqa: E402  (shared with scripts/benchmark.py)

__all__ = ["BIN", "ROOT", "launcher_env"]
