"""What keeps a process and a job alive: Horovod start-up and pinning, heartbeats, the watchdog, the guard
around collectives, signals, fault injection, failed writes, the run directory and its lock, the elastic state.

This room never imports `hvd_mnist.train` (tests/test_layout.py keeps it so): training asks it for help
through one object, `Supervisor`, and the machinery here knows nothing of models or steps' contents.
"""
