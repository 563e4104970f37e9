"""A package, so that the tests import the benchmark's code as `scripts.bench` (pytest's pythonpath is the
repository); the scripts themselves run as files."""
