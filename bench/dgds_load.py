"""DGDS under load: a cluster's instances appending and fetching, the server on its own core.

    python -m bench.dgds_load --instances 64 --requests 100 --tokens-per-s 50 --seconds 60

The server runs as its own process (`seer-dgds serve`, as deployed, with a secret), pinned to one
core; the load generator (one asyncio process, pinned to the other cores) plays ``--instances``
vLLM instances, each with ``--requests`` requests decoding ``--tokens-per-s`` tokens per second.
Groups have ``--group-size`` requests on as many instances (block b of G instances shares its
groups; instance bG + s holds sample s of each), so every token is fetched by G replicas. Each
instance does what DraftClient does: it registers its groups (one RegisterGroups call), then every
``--interval`` seconds sends one message on the server's sync lane (``--transport grpc``: its
SyncStream) with the unsent tokens of each request that has at least ``--update-tokens`` of them,
and the fetch of all its groups from their cursors.
Every ``--generation-s`` the groups are replaced by new ones (an RL iteration's new prompts) and the
old ones are left to their TTL, so the server's memory must level off.

Reported: the server's own CPU time (utime + stime from /proc) per appended token over the timed
window (after ``--warmup-s``), the same per token delivered to a replica, its share of its core,
per-message latency seen by the instances and measured in the server (from GetMetrics: handler
time of a SyncStream message), and the server's RSS over time (JSON, table and PNG under
bench/results/dgds_load/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import secrets
import subprocess
import sys
import time
from array import array
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "dgds_load"
POOL = 1 << 20  # random tokens the requests' streams are cut from
FINAL_FETCH_AFTER_S = 2.0  # after the run, before each instance's last fetch (every instance has stopped appending)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _instance(a: argparse.Namespace, address: str, token: str, inst: int, t0: float, window: tuple[float, float],
                    pool: array, out: dict) -> None:
    import grpc

    from seer.dgds.wire import auth_metadata
    from seer.dgds.proto import dgds_pb2 as pb
    from seer.dgds.proto import dgds_pb2_grpc as pb_grpc

    block, sample = divmod(inst, a.group_size)
    rng = random.Random(inst)
    md = auth_metadata(token)
    lat, stats = out["lat"], out["stats"]
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 1 << 28)]) as ch:
        stub = pb_grpc.DraftServerStub(ch)
        stream = _LaneStream(address, token) if a.transport == "lane" else stub.SyncStream(metadata=md)
        gen = -1
        await asyncio.sleep(max(0.0, t0 - time.time()))
        tick = t0 + rng.random() * a.interval
        while True:
            now = time.time()
            if now >= window[1]:
                break
            if (now - t0) // a.generation_s != gen:  # new prompts: new groups, registered
                gen = int((now - t0) // a.generation_s)
                gids = [f"it{gen}-b{block}-g{k}" for k in range(a.requests)]
                rid = f"s{sample}"
                r = await stub.RegisterGroups(pb.RegisterGroupsRequest(  # (as DraftClient: one call)
                    groups=[pb.RegisterGroupRequest(group_id=g, ttl_seconds=a.ttl) for g in gids]), timeout=30, metadata=md)
                if any(r.status):
                    raise RuntimeError(f"instance {inst}: registration refused: {[e for e in r.error if e][:3]}")
                if a.transport == "lane":
                    await stream.connect(r.sync_lane_port)
                born = time.time()
                phase = [rng.random() for _ in gids]
                base = [rng.randrange(POOL) for _ in gids]
                acked = [0] * len(gids)
                cursor = [0] * len(gids)
                known = [0] * len(gids)
                everything = list(range(len(gids)))
            now = time.time()
            due = [k for k in range(len(gids)) if int(a.tokens_per_s * (now - born) + phase[k]) - acked[k] >= a.update_tokens]
            lens = [int(a.tokens_per_s * (now - born) + phase[k]) - acked[k] for k in due]
            toks = array("I")
            for k, n in zip(due, lens):
                s = (base[k] + acked[k]) % (POOL - 70_000)
                toks.extend(pool[s : s + n])
            req = pb.SyncRequest(group_ids=gids, request_ids=[rid] * len(due), append_group=due,
                                 append_prev=[acked[k] for k in due], append_len=lens, tokens=toks.tobytes(),
                                 fetch_group=everything, fetch_cursor=cursor, fetch_known=known)
            sent = time.time()
            timed = window[0] <= sent < window[1]
            try:
                await stream.write(req)
                resp = await stream.read()
                if resp is grpc.aio.EOF:
                    raise RuntimeError("the server ended the stream")
            except grpc.RpcError as e:
                stats["errors"] += 1
                print(f"instance {inst}: {e.code().name} {e.details()}", file=sys.stderr)
                if a.transport == "lane":
                    await stream.connect(stream.port)
                else:
                    stream = stub.SyncStream(metadata=md)
                await asyncio.sleep(0.1)
                continue
            applied = sum(n for n, st in zip(lens, resp.append_status) if st == pb.APPLIED)
            stats["offered_all"] += sum(lens)
            stats["appended_all"] += applied
            stats["delivered_all"] += len(resp.tokens) // 4
            if timed:
                lat.append(time.time() - sent)
                stats["messages"] += 1
                stats["appended"] += applied
                stats["delivered"] += len(resp.tokens) // 4
                stats["appends"] += len(due)
            stats["unknown"] += len(resp.unknown_groups)
            if resp.unknown_groups and stats["unknown"] == len(resp.unknown_groups):
                print(f"instance {inst}: unknown groups, e.g. {gids[resp.unknown_groups[0]]}", file=sys.stderr)
            for k, c in zip(due, resp.committed):
                acked[k] = c
            cursor = list(resp.fetch_next)
            known = [k + n for k, n in zip(known, resp.fetch_new_requests)]
            tick += a.interval
            delay = tick - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                tick = time.time()
                stats["late"] += 1
        # once every instance has stopped appending: fetch the last generation's groups to their ends
        # (delivered_all_tokens counts every token each replica received, its own ones included)
        await asyncio.sleep(FINAL_FETCH_AFTER_S)
        more = True
        while more and gen >= 0:
            await stream.write(pb.SyncRequest(group_ids=gids, fetch_group=everything, fetch_cursor=cursor,
                                              fetch_known=known))
            resp = await stream.read()
            stats["delivered_all"] += len(resp.tokens) // 4
            cursor = list(resp.fetch_next)
            known = [k + n for k, n in zip(known, resp.fetch_new_requests)]
            more = bool(resp.more)


class _LaneStream:
    """The sync lane (seer/dgds/server/lane.py) with a SyncStream call's write/read, on asyncio."""

    def __init__(self, address: str, token: str):
        self.host, self.token, self.port = address.rsplit(":", 1)[0], token, 0
        self.reader = self.writer = None

    async def connect(self, port: int) -> None:
        from seer.dgds.wire import HELLO, frame

        if self.writer is not None and port == self.port:
            return
        if self.writer is not None:
            self.writer.close()
        self.port = port
        self.reader, self.writer = await asyncio.open_connection(self.host, port)
        self.writer.write(frame(HELLO + self.token.encode()))
        await self._read()

    async def _read(self) -> bytes:
        import grpc

        from seer.dgds.client.lane import LaneError

        n = int.from_bytes(await self.reader.readexactly(4), "little")
        data = await self.reader.readexactly(n)
        if data[0] != 0:
            raise LaneError(grpc.StatusCode.UNKNOWN, data[1:].decode(errors="replace"))
        return data[1:]

    async def write(self, req) -> None:
        from seer.dgds.wire import frame

        self.writer.write(frame(req.SerializeToString()))

    async def read(self):
        from seer.dgds.proto import dgds_pb2 as pb

        return pb.SyncResponse.FromString(await self._read())


def _load(a: argparse.Namespace, address: str, token: str, ids: list[int], t0: float, window: tuple[float, float], q) -> None:
    if a.client_cpus:
        os.sched_setaffinity(0, a.client_cpus)
    rng = random.Random(7)
    pool = array("I", (rng.randrange(50, 60) for _ in range(POOL)))
    outs = [{"lat": [], "stats": dict(messages=0, appended=0, delivered=0, appends=0, errors=0, unknown=0, late=0,
                                      offered_all=0, appended_all=0, delivered_all=0)}
            for _ in ids]

    async def main() -> None:
        await asyncio.gather(*(_instance(a, address, token, i, t0, window, pool, o) for i, o in zip(ids, outs)))

    asyncio.run(main())
    q.put(outs)


def _server_metrics(address: str, token: str) -> dict:
    import grpc

    from seer.dgds.wire import auth_metadata
    from seer.dgds.proto import dgds_pb2 as pb
    from seer.dgds.proto import dgds_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as ch:
        m = pb_grpc.DraftServerStub(ch).GetMetrics(pb.GetMetricsRequest(), timeout=10, metadata=auth_metadata(token))
    return {r.method: {"calls": r.calls, "errors": r.errors, "p50_ms": round(r.total_p50_ms, 3),
                       "p99_ms": round(r.total_p99_ms, 3), "max_ms": round(r.max_ms, 3)} for r in m.rpcs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=64, help="simulated instances feeding the draft server")
    ap.add_argument("--requests", type=int, default=100, help="requests decoding per instance (one per group)")
    ap.add_argument("--group-size", type=int, default=8, help="G: requests per group, each on its own instance")
    ap.add_argument("--tokens-per-s", type=float, default=50.0, help="decode speed of each request")
    ap.add_argument("--update-tokens", type=int, default=8, help="a request's tokens are sent once this many are unsent")
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between an instance's messages (its fetch period)")
    ap.add_argument("--seconds", type=float, default=60.0, help="the timed window")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="seconds of load before the measured window")
    ap.add_argument("--generation-s", type=float, default=30.0, help="groups are replaced by new ones this often")
    ap.add_argument("--ttl", type=float, default=5.0, help="group TTL: memory must level off")
    ap.add_argument("--processes", type=int, default=1, help="load generator processes (instances split across them)")
    ap.add_argument("--server-cpu", type=int, default=0, help="core the server is pinned to (-1: not pinned)")
    ap.add_argument("--transport", choices=("lane", "grpc"), default="lane",
                    help="the server's sync lane (plain TCP, what DraftClient uses) or its gRPC SyncStream")
    ap.add_argument("--eager-trees", action="store_true",
                    help="the server builds every group's tree as tokens come (seer-dgds serve --eager-trees) "
                         "instead of on a first server-side draft, which this load never asks for")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON, table and PNG go")
    ap.add_argument("--name", default="dgds_load", help="file name of the JSON, table and PNG")
    a = ap.parse_args(argv)
    if a.instances < 1 or a.instances % a.group_size or a.seconds <= 0 or a.processes < 1:
        ap.error("--instances must be a positive multiple of --group-size, --seconds > 0, --processes >= 1")
    cpus = sorted(os.sched_getaffinity(0))
    pinned = a.server_cpu >= 0 and len(cpus) > 1
    a.client_cpus = set(c for c in cpus if c != a.server_cpu) if pinned else None

    from tqdm import tqdm

    from seer.metrics_log import percentile

    load_start = os.getloadavg()[0]
    token = secrets.token_urlsafe(32)
    server = subprocess.Popen(
        [sys.executable, "-m", "seer.dgds.server.cli", "serve", "--port", "0", "--reap-interval", "0.5",
         "--log-level", "WARNING", *(["--eager-trees"] if a.eager_trees else [])], stdout=subprocess.PIPE, text=True, env={**os.environ, "SEER_DGDS_TOKEN": token},
        preexec_fn=(lambda: os.sched_setaffinity(0, {a.server_cpu})) if pinned else None)
    if a.client_cpus:
        os.sched_setaffinity(0, a.client_cpus)
    try:
        line = server.stdout.readline()
        if "serving on" not in line:
            raise RuntimeError(f"seer-dgds did not start: {line!r}")
        address = line.strip().rsplit(" ", 1)[1]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        t0 = time.time() + 3.0  # the load processes start (imports) before this
        window = (t0 + a.warmup_s, t0 + a.warmup_s + a.seconds)
        ids = list(range(a.instances))
        procs = [ctx.Process(target=_load, args=(a, address, token, ids[k::a.processes], t0, window, q))
                 for k in range(a.processes)]
        for p in procs:
            p.start()
        rss, util = [], []  # (seconds, value) once a second
        cpu_window: list = [None, None]
        last = (time.time(), _cpu_s(server.pid))
        with tqdm(total=int(window[1] - t0), desc="load", unit="s", mininterval=5, disable=not sys.stderr.isatty()) as bar:
            while any(p.is_alive() for p in procs) and time.time() < window[1] + 0.5:
                time.sleep(0.1)
                now, cpu = time.time(), _cpu_s(server.pid)
                for k in (0, 1):
                    if cpu_window[k] is None and now >= window[k]:
                        cpu_window[k] = (now, cpu)
                if now - last[0] >= 1.0:
                    util.append((round(now - t0, 1), round((cpu - last[1]) / (now - last[0]), 3)))
                    rss.append((round(now - t0, 1), round(_rss_mib(server.pid), 1)))
                    last = (now, cpu)
                bar.update(max(0, min(int(now - t0), bar.total)) - bar.n)
        results = [o for _ in procs for o in q.get(timeout=120)]  # (before join: a child exits once read)
        for p in procs:
            p.join()
        server_lat = _server_metrics(address, token)
    finally:
        server.terminate()
        server.wait(timeout=30)

    lat = [x for r in results for x in r["lat"]]
    tot = {k: sum(r["stats"][k] for r in results) for k in results[0]["stats"]}
    (w0, c0), (w1, c1) = cpu_window
    cpu_s = c1 - c0
    sync = server_lat.get("SyncLane" if a.transport == "lane" else "SyncStream", {})
    reg = server_lat.get("RegisterGroups", {})
    from bench.harness.provenance import code_version

    commit, dirty = code_version()
    summary = {
        "commit": commit + ("+uncommitted" if dirty else ""), "transport": a.transport,
        "server_trees": "eager" if a.eager_trees else "lazy",
        "instances": a.instances, "requests_per_instance": a.requests, "group_size": a.group_size,
        "tokens_per_s_per_request": a.tokens_per_s, "update_tokens": a.update_tokens, "interval_s": a.interval,
        "seconds": a.seconds, "offered_tokens_per_s": round(a.instances * a.requests * a.tokens_per_s),
        "appended_tokens_per_s": round(tot["appended"] / (w1 - w0)),
        "delivered_tokens_per_s": round(tot["delivered"] / (w1 - w0)),
        "server_cpu_s": round(cpu_s, 2), "server_core_share": round(cpu_s / (w1 - w0), 3),
        "server_us_per_appended_token": round(1e6 * cpu_s / max(tot["appended"], 1), 3),
        "server_us_per_delivered_token": round(1e6 * cpu_s / max(tot["delivered"], 1), 3),
        "messages_per_s": round(tot["messages"] / (w1 - w0)), "appends_per_message": round(tot["appends"] / max(tot["messages"], 1), 1),
        "server_msg_p50_ms": sync.get("p50_ms"), "server_msg_p99_ms": sync.get("p99_ms"), "server_msg_max_ms": sync.get("max_ms"),
        "server_register_p99_ms": reg.get("p99_ms"),
        "client_msg_p50_ms": round(1e3 * percentile(lat, 50), 2), "client_msg_p99_ms": round(1e3 * percentile(lat, 99), 2),
        "late_ticks": tot["late"], "errors": tot["errors"] + sum(v["errors"] for v in server_lat.values()),
        "unknown_groups": tot["unknown"],
        # over the whole run, with a last fetch once appends stopped: with one generation
        # (--generation-s past the run), every offered token is appended, and delivered to each of
        # its group's group_size replicas
        "offered_all_tokens": tot["offered_all"], "appended_all_tokens": tot["appended_all"],
        "delivered_all_tokens": tot["delivered_all"],
        "rss_mib_first": rss[1][1] if len(rss) > 1 else None, "rss_mib_mid": rss[len(rss) // 2][1] if rss else None,
        "rss_mib_max": max(m for _, m in rss) if rss else None, "rss_mib_last": rss[-1][1] if rss else None,
        "server_pinned_cpu": a.server_cpu if pinned else None, "client_cpus": sorted(a.client_cpus or cpus),
        "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.dgds_load " + " ".join(argv if argv is not None else sys.argv[1:])
    table = f"`{command}`\n\n| metric | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in summary.items())
    (out / f"{a.name}.json").write_text(json.dumps(
        {**summary, "server_rpcs": server_lat, "command": command, "rss_timeline": rss,
         "server_core_share_timeline": util}, indent=1))
    (out / f"{a.name}.md").write_text(table)
    print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([t for t, _ in rss], [m for _, m in rss], label="RSS (MiB)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("server RSS (MiB)")
    ax2 = ax.twinx()
    ax2.plot([t for t, _ in util], [u for _, u in util], color="tab:orange", lw=0.8)
    ax2.set_ylabel("server core share", color="tab:orange")
    ax2.set_ylim(0, 1.05)
    ax.set_title(f"DGDS: {a.instances} instances x {a.requests} requests, {a.tokens_per_s:g} tok/s each")
    fig.tight_layout()
    fig.savefig(out / f"{a.name}.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
