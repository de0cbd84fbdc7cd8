"""Experiments by simulation (each a `seer-bench` command; the simulator itself is `seer.sim`)."""
