"""`seer-run`: the main command. `seer-run --sync` runs synchronous on-policy GRPO."""

from __future__ import annotations

import argparse
import signal
import sys

from rich.console import Console


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="seer-run", description=__doc__)
    p.add_argument("--sync", action="store_true", help="synchronous, strictly on-policy RL (the only mode)")
    p.add_argument("--config", "-c", help="YAML config file (defaults apply to what it leaves out)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set scheduler.chunk_size=256 (repeatable)")
    p.add_argument("--iterations", type=int, help="number of iterations (overrides the config)")
    p.add_argument("--train", choices=["on", "off"], help="off: rollout and reward only")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the run dir")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --run-dir")
    p.add_argument("--run-dir", help="where metrics, logs and checkpoints go (overrides run_dir; "
                                     "default: a new runs/<date>-<time>, runs/latest points at the newest)")
    p.add_argument("--print-config", action="store_true",
                   help="print every config key with its value (the defaults, with -c and --set applied) and "
                        "what it does, as YAML to start a config file from; then exit")
    return p.parse_args(argv)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from seer.procs.contain import protect

    # The shell's environment (WANDB_API_KEY, a cloud token) stays in /proc/<pid>/environ for the
    # process's life: non-dumpable, only a process with CAP_SYS_PTRACE reads it (agents have none).
    protect()
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if not args.sync and not args.print_config:
        console.print("[red]seer-run: only synchronous on-policy training is supported; pass --sync[/]")
        return 2
    from seer.config import ConfigError, load_config

    overrides = list(args.overrides)
    if args.iterations is not None:
        overrides.append(f"iterations={args.iterations}")
    if args.train is not None:
        overrides.append(f"train.enabled={'true' if args.train == 'on' else 'false'}")
    if args.run_dir is not None:
        overrides.append(f"run_dir={args.run_dir}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        console.print(f"[red]seer-run: invalid configuration: {e}[/]")
        return 2
    if args.print_config:
        from seer.config_help import render

        sys.stdout.write(render(cfg))
        return 0
    # SIGTERM and Ctrl-C raise KeyboardInterrupt wherever the driver is: it unwinds and stops what it
    # started. asyncio.run's own Ctrl-C handler only cancels the main task, and a Ctrl-C during the
    # fleet's start-up was lost that way: the run went on (tests/test_run_processes.py).
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    from seer import loop
    from seer.fleet import FleetError
    from seer.model import CheckpointError
    from seer.plugins import PluginError
    from seer.rundir import RunDirError
    from seer.scheduler import RolloutError
    from seer.tasks import DatasetError, PromptTooLongError, RewardAborted, RewardSpecError
    from seer.trainer.errors import TrainerGroupError

    try:
        loop.run(cfg, console, resume=args.resume, overwrite=args.overwrite)
    except (DatasetError, PromptTooLongError, RewardSpecError, CheckpointError, RunDirError, PluginError,
            ConfigError) as e:
        console.print(f"[red]seer-run: {e}[/]")
        return 2
    except TrainerGroupError as e:  # a rank failed or was lost: what was committed stays
        console.print(f"[red]seer-run: {e}; the run directory keeps every committed iteration: continue it "
                      f"with --resume[/]")
        return 1
    # every instance lost, a request that keeps failing, or a failed sample under reward_error_policy: abort
    except (FleetError, RolloutError, RewardAborted) as e:
        console.print(f"[red]seer-run: {e}[/]")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]seer-run: interrupted; instances stopped[/]")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
