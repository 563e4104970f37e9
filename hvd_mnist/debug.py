"""`hvd-mnist debug RUN_DIR`: every rank's Python stacks and flight record from the job running in RUN_DIR, into
RUN_DIR/debug/, without stopping it (runtime/health/dumps.py is rank 0's side)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hvd_mnist.runtime.storage.rundir import RunDir, in_use

ANSWER_WAIT_S = 30.0  # how long to wait for rank 0 to write the dumps


def main(argv: list[str]) -> int:
    """`hvd-mnist debug RUN_DIR`: ask the job running in RUN_DIR for every rank's dump, without stopping it."""
    parser = argparse.ArgumentParser(prog="hvd-mnist debug", description=main.__doc__)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the --output-dir of a running job")
    parser.add_argument("--wait", type=float, default=ANSWER_WAIT_S, metavar="S",
                        help="how long to wait for rank 0's answer (default: %(default)s)")
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    if not in_use(run_dir):
        print(f"hvd-mnist debug: error: no job is running in {run_dir} (nothing holds its lock); a job that "
              f"failed or stalled left its dumps in {run_dir.debug}/", file=sys.stderr)
        return 1
    run_dir.debug.mkdir(exist_ok=True)
    asked = time.time()
    run_dir.debug_request.write_text(f"asked by hvd-mnist debug at {time.strftime('%H:%M:%S')}\n")
    deadline = time.monotonic() + args.wait
    while run_dir.debug_request.exists():
        if time.monotonic() > deadline:
            run_dir.debug_request.unlink(missing_ok=True)
            print(f"hvd-mnist debug: error: rank 0 did not answer within {args.wait:.0f} s (is it stopped, or is "
                  f"{run_dir} not shared with its host?)", file=sys.stderr)
            return 1
        time.sleep(0.2)
    written = [path for path in sorted(run_dir.debug.glob("rank-*.txt")) if path.stat().st_mtime >= asked - 1]
    if not written:
        print(f"hvd-mnist debug: error: rank 0 answered but could not write {run_dir.debug}/ (its log says why)",
              file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
