"""What the experiments in `bench/` share: trace-driven and replayed backends over real instances,
the time breakdown from /metrics, per-process CPU, simulated Ray nodes, vLLM step probes, the
offline acceptance replay, and the code version a record ran on. No command lines here."""
