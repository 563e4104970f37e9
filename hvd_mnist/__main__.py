"""`python -m hvd_mnist`: the trainer's command line."""

import sys

from hvd_mnist.cli import main

sys.exit(main())
