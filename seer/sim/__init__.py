"""The rollout simulator: the production scheduler (`seer.scheduler`) on modelled engines, in virtual time.

Its parts: the engines (`instance`), their step and chunk costs (`step_model`, `hardware`,
`chunk_model`, with the measured inputs `step_times.json` and `chunk_costs.json`), grouped
speculation's acceptance model (`speculation`), the workloads (`workloads`, multi-turn `scripts`),
the ablation ladder (`ladder`), and the iterations themselves (`simulate`, `multiturn`). The
experiments that run it live in the repository's `bench/` (`seer-bench sim`, `sim-multiturn`, ...).
Nothing else in `seer/` imports it (tests/test_layers.py).
"""
