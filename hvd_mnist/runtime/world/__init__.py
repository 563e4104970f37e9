"""The ranks and their devices: Horovod started and pinned, Horovod Elastic's resets."""
