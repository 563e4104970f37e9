#!/bin/sh
# Container entry point: run the given command (default: the trainer's --help) as PID 1's replacement.
# Under `docker run --user UID:GID` the uid may have no home directory; Horovod, TensorFlow and ssh want a
# writable HOME, so fall back to /tmp when the inherited one is not writable.
set -e
if [ ! -w "${HOME:-/nonexistent}" ]; then
  export HOME=/tmp
fi
exec "$@"
