"""Horovod data-parallel MNIST trainer."""

import os

# TensorFlow's C++ INFO/WARNING lines (oneDNN, CPU features) drown the run's own output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
