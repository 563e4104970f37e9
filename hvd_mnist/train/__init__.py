"""What trains: the loop, its cadence, the replica (model, SGD, moving averages, compiled steps), the batch
plan, the schedule, checkpoints, export and reporting. It leans on `hvd_mnist.runtime` only through the
Supervisor it is handed and a few plain values (World, RunDir, writing)."""
