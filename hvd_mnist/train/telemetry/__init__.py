"""What a run tells the world: the factory of a rank's outputs (outputs.py) and the outputs themselves, rank 0's
log lines, metrics.jsonl and TensorBoard (reporting.py), Prometheus (monitoring.py, metrics_endpoint.py), MLflow
(tracking.py), and the straggler warning (stragglers.py)."""
