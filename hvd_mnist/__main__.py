"""`python -m hvd_mnist`: the trainer's command line."""

from hvd_mnist.cli import run

run()
