"""DGDS under load: many concurrent clients appending and fetching, as a large cluster's instances do.

    python -m bench.dgds_load --clients 64 --seconds 60

The server runs as its own process (`seer-dgds serve`, as deployed); the clients are raw gRPC stubs
spread over worker processes (threads within each), each one an "instance" that owns a few groups'
requests: per round it appends a step's tokens to its requests (UpdateCst) and fetches its groups
incrementally (FetchCst). Groups are short-lived with a TTL, so the server's memory must level off
instead of growing with the run. Reports per-RPC p50/p99 latency, errors, and the server's RSS over
time (table + PNG under bench/results/dgds_load/).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "dgds_load"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _client(address: str, cid: int, seconds: float, groups_per_client: int, ttl: float, out: list) -> None:
    import grpc

    from seer.dgds.server.proto import dgds_pb2 as pb
    from seer.dgds.server.proto import dgds_pb2_grpc as pb_grpc

    rng = random.Random(cid)
    lat = {"update": [], "fetch": []}
    errors = 0
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.DraftServerStub(ch)
        deadline = time.monotonic() + seconds
        generation = 0
        while time.monotonic() < deadline:
            # a new set of groups every ~200 rounds: old ones are left to expire by TTL
            gids = [f"c{cid}-gen{generation}-g{k}" for k in range(groups_per_client)]
            for g in gids:
                stub.RegisterGroup(pb.RegisterGroupRequest(group_id=g, ttl_seconds=ttl), timeout=5)
            counts = {(g, r): 0 for g in gids for r in range(4)}
            cursors = {g: 0 for g in gids}
            for _ in range(200):
                if time.monotonic() >= deadline:
                    break
                ups = []
                for (g, r), n in counts.items():
                    toks = [rng.randrange(50, 60) for _ in range(8)]  # one decode step's batch of tokens
                    ups.append(pb.CstUpdate(group_id=g, request_id=f"r{r}", prev_token_count=n, new_tokens=toks))
                    counts[(g, r)] = n + len(toks)
                t0 = time.perf_counter()
                try:
                    stub.UpdateCst(pb.UpdateCstRequest(updates=ups), timeout=5)
                    lat["update"].append(time.perf_counter() - t0)
                except grpc.RpcError:
                    errors += 1
                t0 = time.perf_counter()
                try:
                    resp = stub.FetchCst(pb.FetchCstRequest(
                        caches=[pb.CacheState(group_id=g, log_offset=c) for g, c in cursors.items()]), timeout=5)
                    lat["fetch"].append(time.perf_counter() - t0)
                    for inc in resp.groups:
                        cursors[inc.group_id] = inc.next
                except grpc.RpcError:
                    errors += 1
            generation += 1
    out.append({"lat": lat, "errors": errors})


def _worker(address: str, ids: list[int], seconds: float, groups: int, ttl: float, q) -> None:
    out: list = []
    threads = [threading.Thread(target=_client, args=(address, i, seconds, groups, ttl, out)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--processes", type=int, default=4, help="client processes (threads split across them)")
    ap.add_argument("--groups-per-client", type=int, default=2)
    ap.add_argument("--ttl", type=float, default=5.0, help="group TTL: memory must level off")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON, table and PNG go")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.processes < 1:
        ap.error("--clients and --processes must be >= 1 and --seconds > 0")

    from tqdm import tqdm

    from seer.metrics_log import percentile

    server = subprocess.Popen(
        [sys.executable, "-m", "seer.dgds.server.cli", "serve", "--port", "0", "--workers", "16", "--reap-interval", "0.5",
         "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if "serving on" not in line:
            raise RuntimeError(f"seer-dgds did not start: {line!r}")
        address = line.strip().rsplit(" ", 1)[1]
        q = mp.get_context("spawn").Queue()
        ids = list(range(args.clients))
        procs = [mp.get_context("spawn").Process(target=_worker, args=(
            address, ids[k::args.processes], args.seconds, args.groups_per_client, args.ttl, q))
            for k in range(args.processes)]
        for p in procs:
            p.start()
        rss = []
        t0 = time.monotonic()
        with tqdm(total=int(args.seconds), desc="load", unit="s", mininterval=5) as bar:
            while any(p.is_alive() for p in procs) and time.monotonic() - t0 < args.seconds + 60:
                rss.append((round(time.monotonic() - t0, 1), round(_rss_mib(server.pid), 1)))
                time.sleep(1.0)
                bar.n = min(int(time.monotonic() - t0), int(args.seconds))
                bar.refresh()
        results = [r for _ in procs for r in q.get(timeout=120)]
        for p in procs:
            p.join()
    finally:
        server.terminate()
        server.wait(timeout=30)

    upd = [x for r in results for x in r["lat"]["update"]]
    fet = [x for r in results for x in r["lat"]["fetch"]]
    errors = sum(r["errors"] for r in results)
    summary = {
        "clients": args.clients, "seconds": args.seconds, "ttl_s": args.ttl,
        "update_calls": len(upd), "update_p50_ms": round(1e3 * percentile(upd, 50), 2), "update_p99_ms": round(1e3 * percentile(upd, 99), 2),
        "fetch_calls": len(fet), "fetch_p50_ms": round(1e3 * percentile(fet, 50), 2), "fetch_p99_ms": round(1e3 * percentile(fet, 99), 2),
        "errors": errors, "rss_mib_first": rss[1][1] if len(rss) > 1 else None,
        "rss_mib_mid": rss[len(rss) // 2][1] if rss else None, "rss_mib_max": max(m for _, m in rss) if rss else None,
        "rss_mib_last": rss[-1][1] if rss else None, "cpus": os.cpu_count(),
    }
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "dgds_load.json").write_text(json.dumps({**summary, "rss_timeline": rss}, indent=1))
    table = "| " + " | ".join(summary) + " |\n|" + "---|" * len(summary) + "\n| " + " | ".join(
        str(v) for v in summary.values()) + " |\n"
    (out / "dgds_load.md").write_text(table)
    print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([t for t, _ in rss], [m for _, m in rss])
    ax.set_xlabel("seconds")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title(f"DGDS under {args.clients} clients (group TTL {args.ttl:g} s)")
    fig.tight_layout()
    fig.savefig(out / "dgds_load.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
