"""``seer-dgds serve --host 127.0.0.1 --port P``: run the draft server until SIGINT/SIGTERM.

The server's secret comes from the environment (``SEER_DGDS_TOKEN``) or a file (``--token-file``),
never from the command line, which every local user can read in /proc. Without one it refuses to
start unless ``--insecure`` says that everyone who can reach the address may use it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from seer.dgds.server.config import TOKEN_ENV
from seer.dgds.server.group_store import Limits


def _token(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as e:
            parser.error(f"--token-file: {e}")
        if not token:
            parser.error(f"--token-file {args.token_file} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    if not args.insecure:
        parser.error(f"no secret: set {TOKEN_ENV} or --token-file PATH (or --insecure to serve without one)")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seer-dgds", description="Seer's Distributed Grouped Draft Server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gRPC draft server")
    serve.add_argument("--host", default="127.0.0.1", help="the only address it listens on")
    serve.add_argument("--port", type=int, default=50061, help="0 picks a free port (printed on start)")
    serve.add_argument("--max-depth", type=int, default=64, help="suffix tree depth bound")
    serve.add_argument("--max-groups", type=int, default=Limits.max_groups)
    serve.add_argument("--no-sync-lane", action="store_true",
                       help="no sync lane (plain-TCP Sync messages on a second port): clients sync over gRPC")
    serve.add_argument("--eager-trees", action="store_true",
                       help="build every group's tree as tokens arrive (default: on the first BatchSpeculate "
                            "that names the group; clients with replicas never ask)"),
    serve.add_argument("--max-tokens-per-update", type=int, default=Limits.max_tokens_per_update)
    serve.add_argument("--max-bytes", type=int, default=None,
                       help="memory budget in bytes, in the server's own accounting (default: a quarter of "
                            "this machine's memory, at most 8 GiB; docs/dgds.md, Limits)")
    serve.add_argument("--max-requests-per-group", type=int, default=Limits.max_requests_per_group)
    serve.add_argument("--max-lane-connections", type=int, default=Limits.max_lane_connections)
    serve.add_argument("--lane-idle", type=float, default=Limits.lane_idle_s,
                       help="seconds a sync-lane connection may stop in the middle of a frame before it is closed")
    serve.add_argument("--lane-unsent-bytes", type=int, default=Limits.lane_unsent_bytes,
                       help="answers a sync-lane connection may have unsent (its client not reading) before "
                            "its further frames wait")
    serve.add_argument("--reap-interval", type=float, default=1.0, help="seconds between TTL sweeps")
    serve.add_argument("--grace", type=float, default=5.0, help="seconds in-flight calls get at shutdown")
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument("--token-file", help=f"file holding the secret clients must send (else ${TOKEN_ENV})")
    serve.add_argument("--insecure", action="store_true", help="serve without a secret if none is given")
    args = parser.parse_args(argv)
    token = _token(args, serve)

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from seer.dgds.server.grpc_server import DgdsServer  # after arg parsing: --help stays fast

    budget = {} if args.max_bytes is None else {"max_bytes": args.max_bytes}
    limits = Limits(max_groups=args.max_groups, max_tokens_per_update=args.max_tokens_per_update,
                    max_requests_per_group=args.max_requests_per_group,
                    max_lane_connections=args.max_lane_connections, lane_idle_s=args.lane_idle,
                    lane_unsent_bytes=args.lane_unsent_bytes, **budget)
    server = DgdsServer(args.host, args.port, max_depth=args.max_depth, limits=limits,
                        reap_interval_s=args.reap_interval, token=token, lazy_trees=not args.eager_trees,
                        sync_lane=not args.no_sync_lane).start()
    auth = "secret required" if token else "no secret: --insecure"
    lane = f", sync lane on port {server.lane_port}" if server.lane_port else ""
    print(f"seer-dgds ({auth}{lane}) serving on {server.address}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logging.getLogger("seer.dgds").info("shutting down (grace %.1fs)", args.grace)
    server.stop(args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
