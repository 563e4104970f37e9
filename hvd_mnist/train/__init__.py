"""What trains: the loop, its cadence, the replica (model, SGD, moving averages, compiled steps), the batch
plan, the schedule, checkpoints, restore and export; telemetry/ holds what a run tells (its outputs). It leans on
`hvd_mnist.runtime` only through the supervisor module (the Supervisor it is handed and a few plain values)."""
