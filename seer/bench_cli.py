"""`seer-bench`: the experiments of a Seer checkout (`bench/`, next to the `seer` package).

    seer-bench COMMAND [its flags]      seer-bench COMMAND --help says what each flag does

The experiments are not part of the installed package (they write their results into the
repository's bench/results/); what they run is (the simulator is `seer.sim`). So a command runs
from the checkout this package was installed from, or else from the checkout the current
directory is in; a command whose module is in `seer/` would run from the package alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

# name -> (module, what it measures); each module's main(argv) takes the flags.
COMMANDS = {
    "compare": ("bench.compare", "real instances, every configuration of the ablation ladder (long)"),
    "multiturn-compare": ("bench.multiturn_compare", "multi-turn: session-sticky, + APRIL, Seer, oracle on real instances"),
    "sim": ("bench.sim.run", "the paper-scale ablation by simulation"),
    "sim-multiturn": ("bench.sim.multiturn", "multi-turn at cluster scale by simulation: session-sticky vs Seer"),
    "sim-vs-real": ("bench.sim_vs_real", "the simulator against recorded real runs"),
    "sim-calibrate": ("bench.sim.calibrate", "fit the simulator's step model to measured step times"),
    "sim-measure-steps": ("bench.sim.measure_steps", "measure vLLM step times on this machine (long)"),
    "sim-measure-chunks": ("bench.sim.measure_chunks", "measure the per-chunk cost on real instances (long)"),
    "sim-replay-compare": ("bench.sim.replay_compare", "the simulator replaying a recorded `compare` run's lengths"),
    "dgds-acceptance": ("bench.dgds_acceptance", "DGDS acceptance length by number of group references"),
    "dgds-multiturn": ("bench.dgds_multiturn", "DGDS on multi-turn trajectories: observations in the group tree or not"),
    "dgds-hotpath": ("bench.dgds_hotpath", "suffix-tree append and drafting cost per core"),
    "dgds-e2e": ("bench.dgds_e2e", "grouped speculative decoding end to end on real instances (long)"),
    "dgds-load": ("bench.dgds_load", "the draft server under many simulated instances"),
    "spec-breakdown": ("bench.spec_breakdown", "per engine step of a speculating instance: forward, proposer, sampler (long)"),
    "dgds-sampling-check": ("bench.dgds_sampling_check", "speculative sampling against the target distribution"),
    "kvpool-prefill": ("bench.kvpool_prefill", "prefix loads from the Mooncake pool vs re-prefill"),
    "task-lengths": ("bench.task_lengths", "response lengths of the built-in task"),
    "default-run": ("bench.default_run", "record a `make run` run directory as a result"),
    "trace-sizes": ("bench.trace_sizes", "sizes of the per-iteration chunk timelines"),
    "cluster-compare": ("bench.cluster_compare", "one Ray node vs two simulated nodes, paired (long)"),
    "weight-push": ("bench.weight_push", "weight push per instance: shared directory vs Ray delivery, one node vs two"),
    "trainer-parallel": ("bench.trainer_parallel", "the trainer at DP=1 / DP=2 / TP=2: step time, gradients, learning (long)"),
    "models-warm-start": ("bench.models_warm_start", "the tiny warm start per model family, with and without offset heads"),
    "models": ("bench.models", "each model family end to end: log-prob mismatch, train step time, learning vs lr=0 (long)"),
    "models-moe": ("bench.models_moe", "Qwen3-MoE: log-prob mismatch and routing differences with and without R3, pool moves (long)"),
    "trainer-tree": ("bench.trainer_tree", "padded vs packed vs prefix-tree micro-batches: tokens, step time, gradients"),
    "routing-capture": ("bench.routing_capture", "MoE routing replay: capture cost per engine step and per token, router disagreement"),
    "failures": ("bench.failures", "record the failure tests' recovery times (real processes; long)"),
    "agent-runner-cost": ("bench.agent_runner_cost", "what containing an agent costs per session: process vs loop mode"),
    "agent-command-cost": ("bench.agent_command_cost", "a command agent's start per session vs agent.serve"),
    "model-isa": ("bench.model_isa", "which instruction-set pin changes the default build's weights"),
    "agent-gateway": ("bench.agent_gateway", "the calculator as an Environment vs as a gateway agent"),
    "gateway-call-cost": ("bench.gateway_call_cost", "what one gateway call costs the driver and the agents, without a model"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"    {name:<{width}}  {what} (python -m {module})" for name, (module, what) in COMMANDS.items())
    return f"{__doc__.strip()}\n\ncommands:\n{rows}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"seer-bench: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[argv[0]][0]
    if module.startswith("bench."):
        root = checkout(Path(__file__).resolve().parents[1], Path.cwd())
        if root is None:
            print(f"seer-bench {argv[0]}: this experiment is {module}, in a Seer checkout's bench/, which is not "
                  f"installed with the package (no bench/ next to {Path(__file__).parent}, nor in {Path.cwd()} "
                  f"or a folder above it). Run seer-bench from inside a checkout, or `python -m {module}` there.",
                  file=sys.stderr)
            return 2
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    import importlib

    return int(importlib.import_module(module).main(argv[1:]) or 0)


def checkout(package_parent: Path, cwd: Path) -> Path | None:
    """The repository whose bench/ the experiments run from: the one the package sits in (a source
    or editable install), else the one `cwd` is in; None when neither is a checkout."""
    for root in (package_parent, cwd, *cwd.parents):
        if (root / "bench" / "harness").is_dir() and (root / "bench" / "results").is_dir():
            return root
    return None


if __name__ == "__main__":
    raise SystemExit(main())
