"""What keeps a process and a job alive, in rooms named for their parts:

- `supervisor.py`: the training side's one door (tests/test_layout.py allows no other way in);
- `boot/`: how a rank's process starts and ends (quiet imports, native output, a quick exit);
- `world/`: the ranks and their devices (Horovod started and pinned, Horovod Elastic's resets);
- `health/`: what tells a live rank from a lost one and says why (heartbeats, watchdog, guard, dumps, signals,
  memory limits);
- `storage/`: where a run's files go (the run directory, its lock, writes that fail in one line);
- `faults.py`: planned faults for the reliability tests.

This package never imports `hvd_mnist.train`: the machinery here knows nothing of models or steps' contents.
"""
