"""Where a run's files go: the run directory, and writes that fail in one line."""
