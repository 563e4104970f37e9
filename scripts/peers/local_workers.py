"""Start N local copies of a command as one job: each gets BENCH_RANK, BENCH_WORLD_SIZE and BENCH_PORTS.

    python scripts/peers/local_workers.py --np 2 -- python scripts/peers/mwms.py ...

BENCH_PORTS holds one free 127.0.0.1 port per worker. The job fails (and the other workers are killed)
as soon as one worker fails; the benchmark bounds the whole job with its own timeout.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out on 127.0.0.1 (held together so that they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run_workers(np_: int, command: list[str]) -> int:
    """Run the workers; the first non-zero exit status, or 0."""
    env = dict(os.environ, BENCH_WORLD_SIZE=str(np_), BENCH_PORTS=",".join(map(str, free_ports(np_))))
    workers = [subprocess.Popen(command, env=dict(env, BENCH_RANK=str(rank))) for rank in range(np_)]
    try:
        while True:
            codes = [worker.poll() for worker in workers]
            failed = [code for code in codes if code not in (None, 0)]
            if failed or all(code == 0 for code in codes):
                return failed[0] if failed else 0
            time.sleep(0.05)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, required=True, dest="np_")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker's argv")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return run_workers(args.np_, command)


if __name__ == "__main__":
    sys.exit(main())
