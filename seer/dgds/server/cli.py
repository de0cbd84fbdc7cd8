"""``seer-dgds serve --host 127.0.0.1 --port P``: run the draft server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from seer.dgds.server.group_store import Limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seer-dgds", description="Seer's Distributed Grouped Draft Server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gRPC draft server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50061, help="0 picks a free port (printed on start)")
    serve.add_argument("--max-depth", type=int, default=64, help="suffix tree depth bound")
    serve.add_argument("--max-groups", type=int, default=Limits.max_groups)
    serve.add_argument("--max-tokens-per-update", type=int, default=Limits.max_tokens_per_update)
    serve.add_argument("--workers", type=int, default=8)
    serve.add_argument("--reap-interval", type=float, default=1.0, help="seconds between TTL sweeps")
    serve.add_argument("--grace", type=float, default=5.0, help="seconds in-flight calls get at shutdown")
    serve.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from seer.dgds.server.grpc_server import DgdsServer  # after arg parsing: --help stays fast

    limits = Limits(max_groups=args.max_groups, max_tokens_per_update=args.max_tokens_per_update)
    server = DgdsServer(args.host, args.port, max_depth=args.max_depth, limits=limits,
                        max_workers=args.workers, reap_interval_s=args.reap_interval).start()
    print(f"seer-dgds serving on {server.address}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logging.getLogger("seer.dgds").info("shutting down (grace %.1fs)", args.grace)
    server.stop(args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
