"""Horovod data-parallel MNIST trainer."""

__version__ = "0.1.0"
