"""Watching a run as RL users do: progress lines in log files, experiment trackers (TensorBoard,
W&B, MLflow), a chunk timeline per iteration (Chrome trace format), a live Prometheus endpoint.

Every tracking library is imported lazily, when its backend is switched on, so the config and the
job import without them.
"""
