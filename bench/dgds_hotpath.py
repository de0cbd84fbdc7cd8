"""DGDS hot path: append throughput, fetch latency, batch_speculate latency for 256 requests.

    python bench/dgds_hotpath.py [--groups 32] [--group-size 8] [--tokens 2000] [--out bench/results/dgds_hotpath]
                                 [--arctic [DIR]] [--ab ROUNDS]

Token streams are synthetic but shaped like a GRPO group's outputs: every response of a group
stitches together phrases from a pool the group shares (the same problem, the same reasoning moves)
with fresh tokens in between, so the trees see realistic repetition. Everything runs on one core
(one Python thread at a time); in-process figures are CPU time, gRPC ones wall clock; tree appends
are the best of --repeats builds. The reference point is ArcticInference's C++ suffix tree, whose
published figures are about 5.5 us per appended token and 9 us per speculated token.

--arctic runs ArcticInference's own tree (``arctic_inference.suffix_decoding``, built from its PyPI
sdist: docs/dgds.md (b)) side by side on the very same streams, batches and 256 speculate rows,
timed the same way: one tree per group (our layout), one tree per request, and its
SuffixDecodingCache as vLLM uses it (a tree per request plus one global tree of all responses).
DIR, if given, is put on sys.path first; without an importable module the side-by-side part is
skipped with a message. --ab ROUNDS (with --arctic) then alternates the two trees in the same
process, round after round (speculate: both layouts; append: both layouts, a round in four), and
reports ArcticInference/ours per round: the two cores here are shared, and the load swings even
CPU time between parts of one run. Writes dgds_hotpath.json and dgds_hotpath.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import grpc

from seer.dgds.client.draft_client import DraftClient
from seer.dgds.tree.drafting import draft
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc
from seer.dgds.server.grpc_server import DgdsServer, params_to_pb
from seer.dgds.tree.suffix_tree import COMPILED, SuffixTree
from seer.dgds.types import DraftParams, SpeculateRow
from seer.request_ids import parse, request_id

ARCTIC_APPEND_US = 5.5
ARCTIC_SPEC_US = 9.0


def group_streams(rng: random.Random, group_size: int, length: int, vocab: int = 32000) -> list[list[int]]:
    phrases = [[rng.randrange(vocab) for _ in range(rng.randint(3, 24))] for _ in range(256)]
    hot = phrases[:16]  # a few moves every response repeats
    out = []
    for _ in range(group_size):
        seq: list[int] = []
        while len(seq) < length:
            r = rng.random()
            if r < 0.3:
                seq += rng.choice(hot)
            elif r < 0.6:
                seq += rng.choice(phrases)
            else:
                seq += [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
        out.append(seq[:length])
    return out


def prefixes_of(streams: list[list[list[int]]], rng: random.Random) -> list[list[list[int]]]:
    """Every request cut somewhere in the middle: a snapshot of the group mid-rollout."""
    return [[s[: int(len(s) * rng.uniform(0.3, 0.9))] for s in g] for g in streams]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _timed_appends(streams: list[list[list[int]]], batch: int, build, repeats: int) -> tuple[dict, object]:
    """The append loop shared by every implementation and layout: rounds of `batch` tokens per
    request, groups in order, requests in order (the order an instance produces them).
    ``build()`` returns (state, jobs): jobs[g][r] = (bound extend method, its first argument)."""
    times, state = [], None
    length = max(len(s) for g in streams for s in g)
    for _ in range(max(1, repeats)):
        state, jobs = build()
        flat = [(ext, key, seq) for jg, g in zip(jobs, streams) for (ext, key), seq in zip(jg, g)]
        t0 = time.process_time()
        for start in range(0, length, batch):
            for ext, key, seq in flat:
                ext(key, seq[start : start + batch])
        times.append(time.process_time() - t0)
    dt = min(times)
    n = sum(len(s) for g in streams for s in g)
    return {"tokens": n, "seconds": dt, "tokens_per_s": n / dt, "us_per_token": 1e6 * dt / n,
            "us_per_token_median": 1e6 * statistics.median(times) / n, "repeats": len(times)}, state


def bench_tree(streams: list[list[list[int]]], depth: int, batch: int,
               compiled: bool | None = None, repeats: int = 1) -> tuple[dict, list[SuffixTree]]:
    """Appends in the interleaved order an instance produces them: every request, `batch` tokens.
    ``streams`` are the requests' outputs so far (the state mid-rollout). ``compiled``: the tree in
    the C core (default when built) or in Python (same trees). Each repeat builds the
    trees afresh; the headline is the best repeat (the two cores here are shared and SMT
    siblings, so a busy neighbour inflates even CPU time), the median is reported next to it."""
    def build():
        trees = [SuffixTree(depth, compiled=compiled) for _ in streams]
        return trees, [[(t.extend, t.add_sequence()) for _ in g] for t, g in zip(trees, streams)]
    res, trees = _timed_appends(streams, batch, build, repeats)
    nodes = sum(t.num_nodes for t in trees)
    res.update(nodes=nodes, nodes_per_token=nodes / res["tokens"])
    return res, trees


def bench_tree_per_request(streams: list[list[list[int]]], depth: int, batch: int,
                           repeats: int = 1) -> tuple[dict, list[list[SuffixTree]]]:
    """Our tree in the per-request layout (one tree per request, nothing shared)."""
    def build():
        trees = [[SuffixTree(depth) for _ in g] for g in streams]
        return trees, [[(t.extend, t.add_sequence()) for t in tg] for tg in trees]
    return _timed_appends(streams, batch, build, repeats)


def load_arctic(path: str | None):
    """ArcticInference's suffix-decoding module (its C++ SuffixTree and SuffixDecodingCache), or
    the reason it is not importable."""
    if path:
        sys.path.insert(0, path)
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        from arctic_inference.suffix_decoding._C import SuffixTree as ArcticTree
    except Exception as e:  # ImportError, or a build for another Python / numpy
        return None, f"{type(e).__name__}: {e}"
    import arctic_inference.suffix_decoding._C as mod
    return {"SuffixTree": ArcticTree, "Cache": SuffixDecodingCache, "file": mod.__file__}, None


def bench_arctic_append(arctic: dict, streams: list[list[list[int]]], depth: int, batch: int,
                        layout: str, repeats: int) -> tuple[dict, object]:
    """ArcticInference's tree on the same appends. layout: "group" (one tree per group, a seq id
    per request: our layout), "request" (one tree per request), "cache" (SuffixDecodingCache with
    no size limit: add_active_response extends the request's local tree and the global tree)."""
    AT, Cache = arctic["SuffixTree"], arctic["Cache"]

    def build():
        if layout == "group":
            trees = [AT(depth) for _ in streams]
            return trees, [[(t.extend, sid) for sid in range(len(g))] for t, g in zip(trees, streams)]
        if layout == "request":
            trees = [[AT(depth) for _ in g] for g in streams]
            return trees, [[(t.extend, 0) for t in tg] for tg in trees]
        cache = Cache(max_tree_depth=depth, max_cached_requests=-1)
        for gi, g in enumerate(streams):
            for ri in range(len(g)):
                cache.start_request(request_id(gi, ri), [])  # the streams are responses: no prompt
        return cache, [[(cache.add_active_response, request_id(gi, ri)) for ri in range(len(g))]
                       for gi, g in enumerate(streams)]
    return _timed_appends(streams, batch, build, repeats)


def speculate_rows(prefixes: list[list[list[int]]], n: int, params: DraftParams) -> list[SpeculateRow]:
    """Requests midway through their response: context = the response so far, which is also all
    the tree holds of it (no peeking at its own future)."""
    rows = []
    for i in range(n):
        gi = i % len(prefixes)
        ri = (i // len(prefixes)) % len(prefixes[gi])
        rows.append(SpeculateRow(request_id(gi, ri), f"g{gi}", prefixes[gi][ri], params))
    return rows


def _spec_result(rows: list, lat: list[float], n_tok: int) -> dict:
    med = statistics.median(lat)
    return {"requests": len(rows), "p50_ms": 1e3 * med, "p99_ms": 1e3 * pct(lat, 0.99),
            "us_per_request": 1e6 * med / len(rows), "spec_tokens": n_tok,
            "us_per_spec_token": 1e6 * med / max(1, n_tok), "mean_draft_len": n_tok / len(rows)}


def bench_speculate(trees, rows: list[SpeculateRow], repeats: int, drafts: list | None = None) -> dict:
    """``trees``: one per group (group ids g0, g1, ...) or, per-request layout, a list per group.
    ``drafts``, if given, receives each row's best path (for the agreement check)."""
    by_row = [trees[int(r.group_id[1:])] for r in rows]
    if by_row and isinstance(by_row[0], list):
        by_row = [tg[parse(r.request_id).sample] for tg, r in zip(by_row, rows)]
    lat, n_tok = [], 0
    for _ in range(repeats):
        t0 = time.process_time()
        n_tok = 0
        for r, tree in zip(rows, by_row):
            tail = list(r.context[-r.params.pattern_lookup_max :])
            paths, _ = draft(tree, tail, r.params)
            n_tok += sum(len(p.tokens) for p in paths)
        lat.append(time.process_time() - t0)
    if drafts is not None:
        drafts[:] = [list(p[0].tokens) if p else [] for p in
                     (draft(t, list(r.context[-r.params.pattern_lookup_max :]), r.params)[0]
                      for r, t in zip(rows, by_row))]
    return _spec_result(rows, lat, n_tok)


def bench_arctic_speculate(state, rows: list[SpeculateRow], layout: str, repeats: int,
                           tree_spec: bool = False, drafts: list | None = None) -> dict:
    """ArcticInference's speculate on the same rows and knobs: at most max_spec_tokens, the same
    min_token_prob, matched suffixes of up to pattern_lookup_max tokens (its speculate tries every
    match length below len(context), so it gets the last pattern_lookup_max + 1 tokens), and
    max_spec_factor=0, max_spec_offset=max_spec_tokens so that a short match is not cut shorter
    (ours has no such cap). tree_spec: its token-tree mode, max_spec_tokens tokens in all."""
    if layout == "cache":
        calls = [(state.speculate, r.request_id) for r in rows]
    else:
        by_row = [state[int(r.group_id[1:])] for r in rows]
        if layout == "request":
            by_row = [tg[parse(r.request_id).sample] for tg, r in zip(by_row, rows)]
        calls = [(t.speculate, None) for t in by_row]
    lat, n_tok = [], 0
    for _ in range(repeats):
        t0 = time.process_time()
        n_tok = 0
        for r, (spec, rid) in zip(rows, calls):
            p = r.params
            tail = list(r.context[-(p.pattern_lookup_max + 1) :])
            if rid is None:
                d = spec(tail, p.max_spec_tokens, 0.0, float(p.max_spec_tokens), p.min_token_prob, tree_spec)
            else:
                d = spec(rid, tail, p.max_spec_tokens, 0.0, float(p.max_spec_tokens), p.min_token_prob, tree_spec)
            n_tok += len(d.token_ids)
        lat.append(time.process_time() - t0)
    if drafts is not None:
        drafts[:] = []
        for r, (spec, rid) in zip(rows, calls):
            p = r.params
            tail = list(r.context[-(p.pattern_lookup_max + 1) :])
            args = (tail, p.max_spec_tokens, 0.0, float(p.max_spec_tokens), p.min_token_prob, tree_spec)
            drafts.append(list((spec(*args) if rid is None else spec(rid, *args)).token_ids))
    return _spec_result(rows, lat, n_tok)


def run_arctic(arctic: dict, prefixes: list[list[list[int]]], depth: int, batch: int, repeats: int,
               linear: DraftParams, k4: DraftParams, ours: dict) -> dict:
    """The side-by-side part: ArcticInference's tree and ours on the same streams and rows.
    ``ours`` holds our trees and drafts (group layout) for the agreement check."""
    out: dict = {"module": arctic["file"],
                 "speculate_knobs": {"max_spec_tokens": linear.max_spec_tokens, "max_spec_factor": 0.0,
                                     "max_spec_offset": float(linear.max_spec_tokens),
                                     "min_token_prob": linear.min_token_prob,
                                     "context_tokens": linear.pattern_lookup_max + 1}}
    rows_lin = speculate_rows(prefixes, 256, linear)
    rows_k4 = speculate_rows(prefixes, 256, k4)
    for layout in ("group", "request", "cache"):
        res, state = bench_arctic_append(arctic, prefixes, depth, batch, layout, repeats)
        drafts: list = []
        res["speculate_linear"] = bench_arctic_speculate(state, rows_lin, layout, 10, drafts=drafts)
        if layout == "group":
            same = sum(a == b for a, b in zip(drafts, ours["drafts"]))
            res["speculate_linear"]["same_draft_as_seer"] = same / len(rows_lin)
            res["speculate_tree"] = bench_arctic_speculate(state, rows_k4, layout, 5, tree_spec=True)
        out[layout] = res
        del state
    return out


def run_ab(arctic: dict, prefixes: list[list[list[int]]], depth: int, batch: int, linear: DraftParams,
           rounds: int) -> dict:
    """Interleaved A/B: ours and ArcticInference's tree alternate, round after round, on the same
    streams and rows (linear speculation: median of 5 per round; appends: one build per round,
    every fourth round). Ratios are ArcticInference / ours (> 1: ours is faster)."""
    rows = speculate_rows(prefixes, 256, linear)
    ours = {"group": bench_tree(prefixes, depth, batch)[1], "request": bench_tree_per_request(prefixes, depth, batch)[1]}
    theirs = {lay: bench_arctic_append(arctic, prefixes, depth, batch, lay, 1)[1] for lay in ("group", "request")}
    out: dict = {"rounds": rounds, "speculate_ms": {}, "append_us": {}}
    for lay in ("group", "request"):
        out["speculate_ms"][lay] = {"seer": [], "arctic": []}
        out["append_us"][lay] = {"seer": [], "arctic": []}
    for r in range(rounds):
        for lay in ("group", "request"):
            sp = out["speculate_ms"][lay]
            sp["seer"].append(bench_speculate(ours[lay], rows, 5)["p50_ms"])
            sp["arctic"].append(bench_arctic_speculate(theirs[lay], rows, lay, 5)["p50_ms"])
        if r % 4 == 0:
            for lay in ("group", "request"):
                ap = out["append_us"][lay]
                if lay == "group":
                    ap["seer"].append(bench_tree(prefixes, depth, batch)[0]["us_per_token"])
                else:
                    ap["seer"].append(bench_tree_per_request(prefixes, depth, batch)[0]["us_per_token"])
                ap["arctic"].append(bench_arctic_append(arctic, prefixes, depth, batch, lay, 1)[0]["us_per_token"])
    for kind in ("speculate_ms", "append_us"):
        for lay, v in out[kind].items():
            v["ratio"] = [a / b for a, b in zip(v["arctic"], v["seer"])]
    return out


def markdown_ab(ab: dict) -> str:
    lines = ["", f"Interleaved A/B ({ab['rounds']} rounds; ArcticInference / Seer per round, > 1: Seer faster):", ""]
    for kind, what in (("speculate_ms", "speculate 256, linear"), ("append_us", "append")):
        for lay, v in ab[kind].items():
            r = v["ratio"]
            lines.append(f"- {what}, {lay} trees: min {min(r):.2f}x, median {statistics.median(r):.2f}x, "
                         f"max {max(r):.2f}x ({len(r)} rounds)")
    return "\n".join(lines) + "\n"


def bench_service(streams: list[list[list[int]]], depth: int, batch: int) -> dict:
    """Over gRPC on 127.0.0.1: UpdateCst rounds (every request's next `batch` tokens in one call),
    incremental FetchCst of all groups after each round, server-side BatchSpeculate of 256 rows,
    and the client library's batch_speculate from its replicas."""
    server = DgdsServer("127.0.0.1", 0, max_depth=depth).start()
    out: dict = {}
    try:
        with grpc.insecure_channel(server.address) as ch:
            stub = pb_grpc.DraftServerStub(ch)
            gids = [f"g{i}" for i in range(len(streams))]
            for gid in gids:
                stub.RegisterGroup(pb.RegisterGroupRequest(group_id=gid, ttl_seconds=3600))
            cursors = {gid: 0 for gid in gids}
            length = max(len(s) for g in streams for s in g)
            up_lat, fetch_lat, fetch_tokens, up_tokens = [], [], [], 0
            for start in range(0, length, batch):
                ups = [pb.CstUpdate(group_id=gid, request_id=f"r{ri}", prev_token_count=start,
                                    new_tokens=seq[start : start + batch])
                       for gid, g in zip(gids, streams) for ri, seq in enumerate(g) if start < len(seq)]
                up_tokens += sum(len(u.new_tokens) for u in ups)
                t0 = time.perf_counter()
                stub.UpdateCst(pb.UpdateCstRequest(updates=ups))
                up_lat.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                resp = stub.FetchCst(pb.FetchCstRequest(
                    caches=[pb.CacheState(group_id=g, log_offset=c) for g, c in cursors.items()]))
                fetch_lat.append(time.perf_counter() - t0)
                fetch_tokens.append(sum(len(s.tokens) for inc in resp.groups for s in inc.segments))
                for inc in resp.groups:
                    cursors[inc.group_id] = inc.next
            per_round = sum(len(g) for g in streams) * batch
            out["update_cst"] = {"tokens_per_call": per_round, "p50_ms": 1e3 * statistics.median(up_lat),
                                 "p99_ms": 1e3 * pct(up_lat, 0.99), "tokens_per_s": up_tokens / sum(up_lat)}
            out["fetch_cst"] = {"groups": len(gids), "tokens_per_fetch": statistics.mean(fetch_tokens),
                                "p50_ms": 1e3 * statistics.median(fetch_lat), "p99_ms": 1e3 * pct(fetch_lat, 0.99)}
            params = DraftParams(max_spec_tokens=8, pattern_lookup_max=24)
            rows = speculate_rows(streams, 256, params)
            req = pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(request_id=r.request_id, group_id=r.group_id,
                                                                 context=r.context[-24:], params=params_to_pb(params))
                                                 for r in rows])
            lat = []
            for _ in range(10):
                t0 = time.perf_counter()
                stub.BatchSpeculate(req)
                lat.append(time.perf_counter() - t0)
            out["server_batch_speculate_256"] = {"p50_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * pct(lat, 0.99)}
        # Client library: replicas filled by fetch, then batch_speculate from them.
        client = DraftClient(server.address, fetch_interval_s=0.01)
        try:
            t0 = time.perf_counter()
            for gid in [f"g{i}" for i in range(len(streams))]:
                client.register_group(gid, 3600)
            client.sync(120)
            client.sync(120)
            out["replica_build_from_fetch_s"] = time.perf_counter() - t0
            lat = []
            for _ in range(10):
                t0 = time.perf_counter()
                client.batch_speculate(rows)
                lat.append(time.perf_counter() - t0)
            out["client_batch_speculate_256"] = {"p50_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * pct(lat, 0.99)}
        finally:
            client.close(0)
    finally:
        server.stop(1)
    return out


def _median(r: dict) -> str:
    if r.get("repeats", 1) < 2:
        return ""
    return f" (best of {r['repeats']}; median {r['us_per_token_median']:.2f})"


def _us(r: dict) -> str:
    return f"{r['us_per_token']:.2f} us/token{_median(r)}"


def _spec(r: dict) -> str:
    return f"p50 {r['p50_ms']:.2f} ms, {r['us_per_spec_token']:.2f} us/spec token (mean draft {r['mean_draft_len']:.2f})"


def markdown_arctic(res: dict) -> str:
    a, cfg = res["arctic"], res["config"]
    if "skipped" in a:
        return f"\nArcticInference side by side: skipped ({a['skipped']}).\n"
    t, tp, s, sp, k = (res["tree_append"], res["tree_append_per_request"], res["speculate_linear"],
                       res["speculate_linear_per_request"], res["speculate_k4"])
    kn = a["speculate_knobs"]
    rows = [
        (f"append, one tree per group ({cfg['groups']} trees x {cfg['group_size']} requests)", _us(t), _us(a["group"])),
        (f"append, one tree per request ({cfg['groups'] * cfg['group_size']} trees)", _us(tp), _us(a["request"])),
        ("append, SuffixDecodingCache.add_active_response (request's tree + global tree)", "", _us(a["cache"])),
        ("speculate 256, linear, group trees", _spec(s), _spec(a["group"]["speculate_linear"])),
        ("speculate 256, linear, per-request trees", _spec(sp), _spec(a["request"]["speculate_linear"])),
        ("speculate 256, SuffixDecodingCache.speculate (request's tree + global tree)", "",
         _spec(a["cache"]["speculate_linear"])),
        ("speculate 256, group trees: Seer top-4 paths / Arctic token tree (use_tree_spec)", _spec(k),
         _spec(a["group"]["speculate_tree"])),
    ]
    lines = ["", f"Side by side with ArcticInference's C++ suffix tree (built from the arctic-inference 0.3.0 sdist), "
             f"same streams, same append batches, same 256 rows; CPU time on one core, appends best of "
             f"{t['repeats']}. Speculation: at most {kn['max_spec_tokens']} tokens, min_token_prob "
             f"{kn['min_token_prob']}, matches up to {kn['context_tokens'] - 1} tokens (Arctic: max_spec_factor 0, "
             f"max_spec_offset {kn['max_spec_offset']:g}, last {kn['context_tokens']} context tokens). Linear drafts "
             f"identical to Seer's on group trees: {100 * a['group']['speculate_linear']['same_draft_as_seer']:.1f}% "
             f"of rows.", "",
             "| operation | Seer | ArcticInference C++ |", "|---|---|---|"]
    lines += [f"| {x} | {y} | {z} |" for x, y, z in rows]
    return "\n".join(lines) + "\n"


def markdown(res: dict) -> str:
    t, s, k, v = res["tree_append"], res["speculate_linear"], res["speculate_k4"], res["service"]
    core = "compiled core" if res["config"].get("compiled") else "pure Python (SEER_DGDS_PURE_PYTHON=1)"
    rows = [
        (f"append, tree ({core}; in-process, CPU time)", f"{t['tokens_per_s']:,.0f} tokens/s",
         f"{t['us_per_token']:.2f} us/token{_median(t)}", f"{ARCTIC_APPEND_US} us/token"),
    ]
    if "tree_append_python" in res:
        p = res["tree_append_python"]
        rows.append(("append, tree (pure Python; in-process, CPU time)", f"{p['tokens_per_s']:,.0f} tokens/s",
                     f"{p['us_per_token']:.2f} us/token{_median(p)}", ""))
    rows += [
        ("append, UpdateCst over gRPC", f"{v['update_cst']['tokens_per_s']:,.0f} tokens/s",
         f"p50 {v['update_cst']['p50_ms']:.1f} ms / {v['update_cst']['tokens_per_call']} tokens", ""),
        (f"fetch_cst, {v['fetch_cst']['groups']} groups incremental", f"p50 {v['fetch_cst']['p50_ms']:.2f} ms",
         f"p99 {v['fetch_cst']['p99_ms']:.2f} ms ({v['fetch_cst']['tokens_per_fetch']:.0f} new tokens)", ""),
        ("batch_speculate 256, linear (tree, CPU time)", f"p50 {s['p50_ms']:.2f} ms",
         f"{s['us_per_spec_token']:.2f} us/spec token (mean draft {s['mean_draft_len']:.2f})", f"{ARCTIC_SPEC_US} us/spec token"),
        ("batch_speculate 256, top-4 (tree, CPU time)", f"p50 {k['p50_ms']:.2f} ms",
         f"{k['us_per_spec_token']:.2f} us/spec token", ""),
        ("batch_speculate 256, DraftClient (wall)", f"p50 {v['client_batch_speculate_256']['p50_ms']:.2f} ms",
         f"p99 {v['client_batch_speculate_256']['p99_ms']:.2f} ms", ""),
        ("BatchSpeculate 256 over gRPC (server, wall)", f"p50 {v['server_batch_speculate_256']['p50_ms']:.2f} ms",
         f"p99 {v['server_batch_speculate_256']['p99_ms']:.2f} ms", ""),
    ]
    cfg = res["config"]
    head = (f"DGDS hot path ({cfg['groups']} groups x {cfg['group_size']} requests x {cfg['tokens']} tokens, "
            f"depth {cfg['depth']}, update batch {cfg['batch']}; {cfg['machine']})\n\n")
    lines = ["| operation | result | detail | ArcticInference C++ (published) |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    out = head + "\n".join(lines) + "\n"
    if "arctic" in res:
        out += markdown_arctic(res)
    if "ab" in res:
        out += markdown_ab(res["ab"])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=32, help="groups of synthetic token streams")
    ap.add_argument("--group-size", type=int, default=8, help="requests per group")
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per request")
    ap.add_argument("--depth", type=int, default=64, help="suffix-tree depth (max_depth)")
    ap.add_argument("--batch", type=int, default=16, help="tokens per request per update")
    ap.add_argument("--seed", type=int, default=0, help="seeds the synthetic streams")
    ap.add_argument("--repeats", type=int, default=5, help="tree appends: best of this many builds")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dgds_hotpath", help="where the JSON and markdown go")
    ap.add_argument("--arctic", nargs="?", const="", default=None, metavar="DIR",
                    help="also run ArcticInference's suffix tree side by side (DIR: put on sys.path first)")
    ap.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                    help="with --arctic: this many interleaved rounds of ours vs ArcticInference's tree")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    streams = [group_streams(rng, args.group_size, args.tokens) for _ in range(args.groups)]
    prefixes = prefixes_of(streams, rng)
    tree_res, trees = bench_tree(prefixes, args.depth, args.batch, repeats=args.repeats)
    linear, k4 = DraftParams(8, 1, 24, 1, 0.1), DraftParams(8, 1, 24, 4, 0.1)
    drafts: list = []  # our linear drafts (group trees), for the agreement check with --arctic
    res = {
        "config": {"groups": args.groups, "group_size": args.group_size, "tokens": args.tokens, "depth": args.depth,
                   "batch": args.batch, "seed": args.seed, "compiled": COMPILED,
                   "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, 1 core"},
        "tree_append": tree_res,
        "speculate_linear": bench_speculate(trees, speculate_rows(prefixes, 256, linear), 10, drafts),
        "speculate_k4": bench_speculate(trees, speculate_rows(prefixes, 256, k4), 5),
        "service": bench_service(prefixes, args.depth, args.batch),
        "arctic_reference_us": {"append_per_token": ARCTIC_APPEND_US, "speculate_per_token": ARCTIC_SPEC_US},
    }
    if COMPILED:  # the pure-Python tree's figure too (what SEER_DGDS_PURE_PYTHON=1 runs)
        res["tree_append_python"] = bench_tree(prefixes, args.depth, args.batch, compiled=False,
                                               repeats=args.repeats)[0]
    if args.arctic is not None:
        arctic, why = load_arctic(args.arctic or None)
        if arctic is None:
            msg = (f"arctic_inference.suffix_decoding is not importable ({why}); build it from the PyPI "
                   "sdist as in docs/dgds.md (b) and pass its directory: --arctic DIR")
            print(f"--arctic: skipped: {msg}", file=sys.stderr)
            res["arctic"] = {"skipped": msg}
        else:
            del trees  # one layout's trees in memory at a time
            per_req, trees_pr = bench_tree_per_request(prefixes, args.depth, args.batch, args.repeats)
            res["tree_append_per_request"] = per_req
            res["speculate_linear_per_request"] = bench_speculate(trees_pr, speculate_rows(prefixes, 256, linear), 10)
            del trees_pr
            res["arctic"] = run_arctic(arctic, prefixes, args.depth, args.batch, args.repeats, linear, k4,
                                       {"drafts": drafts})
            if args.ab > 0:
                res["ab"] = run_ab(arctic, prefixes, args.depth, args.batch, linear, args.ab)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dgds_hotpath.json").write_text(json.dumps(res, indent=2))
    md = markdown(res)
    (args.out / "dgds_hotpath.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
