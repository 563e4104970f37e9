"""Run a worker script once the interpreter is up, marking that moment, so that the framework's import (in the
script's first lines) is timed as a phase of its own.

    python scripts/peers/started.py scripts/peers/torch_ddp.py --data ... (the worker's own flags)
"""

from __future__ import annotations

import runpy
import sys

from common import PHASES

if __name__ == "__main__":
    PHASES.done("interpreter")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]  # the worker sees its own name and flags
    runpy.run_path(script, run_name="__main__")
