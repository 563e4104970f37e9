"""What native code (Horovod's C++ logger, TensorFlow's, a crashing library's last words) writes to file
descriptor 2, passed to the console by a small process of its own, less Horovod's log lines.

When a peer dies, Horovod's background loop logs its own error ("Horovod background loop uncaught exception: ...
Connection closed by peer") beside hvd_mnist's one line, which already names the cause. From `hvd.init` on, fd 2
is an unlinked file (a write to it never blocks, as one to a pipe nobody reads would); Python's own stderr keeps
the console. A child process (this file, run as a script: the standard library only) passes the file's new lines
on every POLL_S and, once the rank has ended, the rest: an abort's last line ("LLVM ERROR: ...", "Check failed")
reaches the console even when the rank had no time to pass it on. Horovod's lines stay in the rank's log: its
dump (debug/rank-K.txt) ends with them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

POLL_S = 0.1
HELD_LINES = 40  # the newest of Horovod's lines a dump shows
HOROVOD_LOG = re.compile(rb"^\[\d{4}-\d\d-\d\d [\d:. ]+: [EWF] [^\]]*/horovod/")  # [time: LEVEL path:line] ...

_capture: list[int] = []  # the file's descriptor, once started


def start() -> None:
    """Send fd 2 to the file, Python's stderr to the console, and start the passer (once a process). Where the
    passer cannot start (no memory, no processes left), fd 2 stays the console."""
    if _capture:
        return
    sys.stderr.flush()
    handle, path = tempfile.mkstemp(prefix="hvd-mnist-native-")
    os.unlink(path)
    try:
        subprocess.Popen([sys.executable, "-S", __file__, str(os.getpid())], stdin=handle, stdout=2,
                         stderr=subprocess.DEVNULL)
    except OSError:
        os.close(handle)
        return
    console = os.dup(2)
    os.dup2(handle, 2)
    sys.stderr = open(console, "w", buffering=1, errors="backslashreplace")  # noqa: SIM115 (the console, for good)
    _capture.append(handle)


def held() -> list[str]:
    """Horovod's newest log lines, kept off the console (none before start)."""
    if not _capture:
        return []
    try:
        text = os.pread(_capture[0], 1 << 24, 0)
    except OSError:
        return []
    return [line.decode(errors="replace") for line in text.splitlines() if HOROVOD_LOG.match(line)][-HELD_LINES:]


def pass_on(parent: int) -> None:
    """The passer: the file (its stdin) to the console (its stdout), until `parent` has ended and all is passed."""
    offset, partial = 0, b""
    while True:
        ended = os.getppid() != parent
        new = os.pread(0, 1 << 20, offset)
        offset += len(new)
        *lines, partial = (partial + new).split(b"\n")
        if ended and partial and not new:
            lines, partial = [*lines, partial], b""
        shown = b"".join(line + b"\n" for line in lines if not HOROVOD_LOG.match(line))
        if shown:
            sys.stdout.buffer.write(shown)
            sys.stdout.buffer.flush()
        if ended and not new:
            return
        if not new:
            time.sleep(POLL_S)


if __name__ == "__main__":
    pass_on(int(sys.argv[1]))
