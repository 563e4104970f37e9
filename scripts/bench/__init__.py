"""The benchmark (`scripts/benchmark.py`) as a small package; `launching` is shared with the tests."""
