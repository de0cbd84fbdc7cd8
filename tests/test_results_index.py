"""The recorded benchmark results and the docs that quote them agree (no vLLM, no model).

`bench/results/README.md` indexes every recorded file; the README's and docs' result tables are
parsed row by row and each number is compared with the recorded JSON, at the precision shown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "README.md"
IGNORED_DIRS = {"logs", "kvpool"}  # run-time output the benches write next to results (.gitignore)


# ---------------------------------------------------------------- markdown helpers

def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[tuple[int, list[str], list[list[str]]]]:
    """Every pipe table in `text`: (line number of its header, header cells, body rows)."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.fullmatch(r"\s*\|(\s*:?-+:?\s*\|)+\s*", lines[i + 1]):
            header, rows, j = cells(lines[i]), [], i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                rows.append(cells(lines[j]))
                j += 1
            out.append((i, header, rows))
            i = j
        else:
            i += 1
    return out


def table_after(path: Path, anchor: str, header_starts: str) -> tuple[list[str], list[list[str]]]:
    """The first table after the line containing `anchor` whose header starts with `header_starts`."""
    text = path.read_text()
    lines = text.splitlines()
    at = [n for n, line in enumerate(lines) if anchor in line]
    assert at, f"{path.name}: no line contains {anchor!r}"
    for start, header, rows in tables(text):
        if start > at[0] and " | ".join(header).startswith(header_starts):
            return header, rows
    raise AssertionError(f"{path.name}: no table starting {header_starts!r} after {anchor!r}")


NUM = re.compile(r"(?<![A-Za-z\d.])-?\d[\d,]*(?:\.\d+)?")  # not the 50 of "p50"


def numbers(cell: str) -> list[tuple[float, int]]:
    """The numbers in a cell with their decimals shown: '2803 (2638-3060)' -> [(2803, 0), (2638, 0), (3060, 0)]."""
    out = []
    for m in NUM.finditer(cell.replace("**", "").replace("−", "-")):
        s = m.group().replace(",", "")
        if s.startswith("-") and m.start() > 0:  # a range's dash, not a sign
            s = s[1:]
        out.append((float(s), len(s.split(".")[1]) if "." in s else 0))
    return out


def agrees(cell: str, expected: list[float], what: str, scale: float = 1.0) -> None:
    """Each number of `cell` equals the matching expected value at the precision the cell shows."""
    got = numbers(cell)
    assert got, f"{what}: {cell!r} shows no number"
    for (v, dec), e in zip(got, expected):  # a cell may show fewer (a mean without its range)
        e = e * scale
        assert abs(v - e) <= 0.5 * 10 ** -dec + 1e-9, f"{what}: {cell!r} shows {v}, the recorded file has {e:.4f}"


def label(cell: str) -> str:
    return cell.replace("**", "").strip()


# ---------------------------------------------------------------- the index

def index_rows() -> list[dict[str, str]]:
    header, rows = table_after(INDEX, "# Recorded benchmark results", "bench | files | date | commit")
    return [dict(zip(header, r)) for r in rows]


def row_files(row: dict[str, str]) -> list[str]:
    """The files a row lists; a glob (`failures/*.json`) stands for the files it matches (maybe none yet:
    records a bench writes one by one)."""
    out = []
    for f in re.findall(r"`([^`]+)`", row["files"]):
        if any(c in f for c in "*?["):
            out += sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.glob(f) if p.is_file())
        else:
            out.append(f)
    return out


def indexed_files() -> list[str]:
    return [f for row in index_rows() for f in row_files(row)]


def recorded_files() -> list[str]:
    out = []
    for p in RESULTS.rglob("*"):
        rel = p.relative_to(RESULTS)
        if p.is_file() and not IGNORED_DIRS & set(rel.parts[:-1]) and rel.as_posix() != "README.md":
            out.append(rel.as_posix())
    return sorted(out)


def test_every_recorded_file_is_indexed_and_every_indexed_file_exists():
    listed = indexed_files()
    assert len(listed) == len(set(listed)), "a file is listed twice"
    missing = sorted(set(recorded_files()) - set(listed))
    assert not missing, f"files under bench/results/ that bench/results/README.md does not list: {missing}"
    absent = sorted(f for f in listed if not (RESULTS / f).is_file())
    assert not absent, f"bench/results/README.md lists files that do not exist: {absent}"


def test_index_rows_name_a_date_a_commit_a_status_and_a_command():
    rows = index_rows()
    assert len(rows) >= 8
    for row in rows:
        if row["date"] == row["commit"] == "per file":  # records that carry their own date and commit
            for f in (f for f in row_files(row) if f.endswith(".json")):
                rec = load(f)
                assert re.match(r"20\d\d-\d\d-\d\d", rec["date"]) and rec["commit"] and rec["command"], f
        else:
            assert re.fullmatch(r"20\d\d-\d\d-\d\d", row["date"]), row
            assert re.fullmatch(r"[0-9a-f]{7,40}", row["commit"]), row
        assert row["status"] in ("current", "stale"), row
        assert re.fullmatch(r"`python (-m bench\.|bench/)\S.*`", row["command"]), row


def test_every_index_command_names_a_module_of_this_checkout():
    """A recorded command still runs: `python -m bench.x.y` is a module (or a package with a
    __main__) under bench/, `python bench/x.py` a file (the index says what replaced a moved one)."""
    missing = []
    for row in index_rows():
        m = re.match(r"`python (?:-m ([\w.]+)|(bench/[\w/]+\.py))", row["command"])
        path = ROOT / m.group(2) if m.group(2) else ROOT.joinpath(*m.group(1).split("."))
        if not (path.is_file() or path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
            missing.append(row["command"])
    assert not missing, f"index commands whose module is gone: {missing}"


# bench-log.md is the dated history: it names results that later recordings replaced
DOCS = [ROOT / "README.md", *sorted(d for d in (ROOT / "docs").glob("*.md") if d.name != "bench-log.md")]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_the_docs_cite_only_indexed_files(doc):
    """The README's and every docs page's result paths point at indexed files and existing folders."""
    text = doc.read_text()
    listed = set(indexed_files()) | {"README.md"}
    # a path followed by "at <commit>" names an earlier recording, read from that commit
    cited = set(re.findall(r"bench/results/([\w./-]+\.(?:md|jsonl|json|png))(?![\w`]* at [0-9a-f]{7})", text))
    if doc.name == "README.md":
        assert cited, "README cites no recorded file"
    assert cited <= listed, f"{doc.name} cites files the index does not list: {sorted(cited - listed)}"
    folders = set(re.findall(r"bench/results/([\w/-]+)/", text))
    assert all((RESULTS / f).is_dir() for f in folders), f"{doc.name} cites missing folders: {sorted(folders)}"


def load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


# ---------------------------------------------------------------- seer-bench compare

COMPARE_COLUMNS = {  # header -> the recorded values a cell shows (in order), and a scale
    "output tok/s (min-max)": (("tokens_per_s", "tokens_per_s_min", "tokens_per_s_max"), 1.0),
    "vs baseline (min-max)": (("ratio", "ratio_min", "ratio_max"), 1.0),
    "wall s": (("wall_s",), 1.0),
    "tail s (min-max)": (("tail_s", "tail_s_min", "tail_s_max"), 1.0),
    "idle": (("idle_fraction",), 100.0),
    "preemptions": (("preemptions",), 1.0),
    "chunks (migrated)": (("chunks_dispatched", "chunks_migrated"), 1.0),
    "output tokens": (("output_tokens",), 1.0),
    "acceptance length": (("mean_acceptance_length",), 1.0),
}


def check_compare_table(doc: Path, anchor: str, recorded: str, min_rows: int) -> None:
    header, rows = table_after(doc, anchor, "configuration | output tok/s")
    configs = {r["label"]: r for r in load(recorded)["configs"].values()}
    assert len(rows) >= min_rows
    for row in rows:
        name = label(row[0])
        assert name in configs, f"{doc.name}: row {name!r} is not a configuration of {recorded}"
        rec = configs[name]
        for col, cell in zip(header[1:], row[1:]):
            if col not in COMPARE_COLUMNS:
                continue
            keys, scale = COMPARE_COLUMNS[col]
            if rec.get(keys[0]) is None:
                assert cell.strip() == "-", f"{doc.name} {name} {col}: {cell!r}, recorded none"
                continue
            agrees(cell, [rec[k] for k in keys], f"{doc.name} {name} {col}", scale)


def test_scheduling_doc_compare_ladder_matches_the_recording():
    check_compare_table(ROOT / "docs" / "scheduling.md", "# Scheduling on real instances", "compare/compare.json", 5)


def test_bench_doc_compare_tables_match_the_recordings():
    check_compare_table(ROOT / "docs" / "bench.md", "### The default long-tail workload", "compare/compare.json", 5)
    check_compare_table(ROOT / "docs" / "bench.md", "### 16 groups: bound by one response",
                        "compare/run_iteration/compare.json", 2)


def test_compare_recordings_say_what_the_docs_say_of_their_setup():
    """The packing run: 2 instances per configuration, 2 repeats (the README once said four)."""
    s = load("compare/packing/compare.json")["settings"]
    assert (s["instances"], s["repeats"], s["groups"]) == (2, 2, 32)
    assert "four instances" not in (ROOT / "docs" / "scheduling.md").read_text()


# ---------------------------------------------------------------- DGDS

@pytest.mark.parametrize("doc,anchor", [("docs/dgds.md", "**(a) Acceptance by number of group references**"),
                                        ("docs/dgds.md", "### (a) Offline acceptance")])
def test_dgds_acceptance_tables_match_the_recording(doc, anchor):
    header, rows = table_after(ROOT / doc, anchor, "group references n | linear")
    rec = load("dgds_acceptance/dgds_acceptance.json")["mean_acceptance_length"]
    modes = {"linear": "linear", "multi-path k=2": "k=2", "multi-path k=4": "k=4"}
    assert {r[0] for r in rows} == set(rec), f"{doc}: rows {[r[0] for r in rows]} vs recorded n {sorted(rec)}"
    for row in rows:
        for col, cell in zip(header[1:], row[1:]):
            if col in modes:
                agrees(cell, [rec[row[0]][modes[col]]], f"{doc} n={row[0]} {col}")
    ngram = load("dgds_acceptance/dgds_acceptance.json")["vllm_ngram"]["mean_acceptance_length"]
    assert f"{ngram:.2f}" in (ROOT / doc).read_text()


def test_dgds_doc_hot_path_summary_matches_the_recording():
    header, rows = table_after(ROOT / "docs" / "dgds.md", "**(b) Hot path**", "operation | Seer")
    rec = load("dgds_hotpath/dgds_hotpath.json")
    arctic = rec["arctic"]
    by_label = {label(r[0]): r for r in rows}

    def row(prefix: str) -> list[str]:
        hits = [r for name, r in by_label.items() if name.startswith(prefix)]
        assert len(hits) == 1, f"docs/dgds.md hot-path summary: {len(hits)} rows start with {prefix!r}"
        return hits[0]

    ta, tp = rec["tree_append"], rec["tree_append_python"]
    r = row("append, compiled core")
    agrees(r[1], [ta["us_per_token"], ta["us_per_token_median"]], "append compiled, Seer")
    agrees(r[2], [arctic["group"]["us_per_token"], arctic["group"]["us_per_token_median"]], "append, Arctic")
    agrees(r[3], [rec["arctic_reference_us"]["append_per_token"]], "append, published")
    agrees(row("append, pure-Python")[1], [tp["us_per_token"], tp["us_per_token_median"]], "append python")
    agrees(row("append as its vLLM integration")[2],
           [arctic["cache"]["us_per_token"], arctic["cache"]["us_per_token_median"]], "append, Arctic cache")
    lin, k4 = rec["speculate_linear"], rec["speculate_k4"]
    r = row("`batch_speculate`, 256 requests, linear")
    agrees(r[1], [lin["p50_ms"], lin["us_per_spec_token"]], "speculate linear, Seer")
    a = arctic["group"]["speculate_linear"]
    agrees(r[2], [a["p50_ms"], a["us_per_spec_token"]], "speculate linear, Arctic")
    agrees(r[3], [rec["arctic_reference_us"]["speculate_per_token"]], "speculate, published")
    r = row("`batch_speculate`, 256 requests, top-4")
    agrees(r[1], [k4["p50_ms"], k4["us_per_spec_token"]], "speculate top-4, Seer")
    a = arctic["group"]["speculate_tree"]
    agrees(r[2], [a["p50_ms"], a["us_per_spec_token"]], "speculate tree, Arctic")
    agrees(row("`fetch_cst`")[1], [rec["service"]["fetch_cst"]["p50_ms"]], "fetch_cst")
    agrees(row("`UpdateCst`")[1], [rec["service"]["update_cst"]["tokens_per_s"]], "UpdateCst")


def test_dgds_doc_hot_path_rounds_are_the_recorded_ones():
    ab = load("dgds_hotpath/dgds_hotpath.json")["ab"]
    text = (ROOT / "docs" / "dgds.md").read_text()
    spec_rounds = {len(v["ratio"]) for v in ab["speculate_ms"].values()}
    append_rounds = {len(v["ratio"]) for v in ab["append_us"].values()}
    assert len(spec_rounds) == len(append_rounds) == 1
    (n_spec,), (n_append,) = spec_rounds, append_rounds
    m = re.search(r"medians of (\d+) interleaved A/B rounds of drafting and (\d+) of appends", text)
    assert m, "docs/dgds.md's hot-path summary no longer states the A/B rounds as expected"
    assert (int(m.group(1)), int(m.group(2))) == (n_spec, n_append)


def test_dgds_doc_end_to_end_summary_matches_the_recording():
    header, rows = table_after(ROOT / "docs" / "dgds.md", "**(c) End to end on real vLLM instances**", "drafting | output tokens/s")
    rec = load("dgds_e2e/dgds_e2e.json")
    phases = {p["name"]: p for p in rec["phases"]}
    names = {"group (Seer)": "group", "per-request only": "per-request", "none": "none"}
    assert {label(r[0]) for r in rows} == set(names)
    for row in rows:
        p = phases[names[label(row[0])]]
        for col, cell in zip(header[1:], row[1:]):
            what = f"docs/dgds.md (c) {label(row[0])} {col}"
            if col == "output tokens/s":
                agrees(cell, [p["tokens_per_s"]], what)
            elif col.startswith("vs none"):
                order = [q["name"] for q in rec["phases"]]  # each repeat lists its phases in this order
                mine, none = order.index(p["name"]), order.index("none")
                per = [rep[mine]["tokens_per_s"] / rep[none]["tokens_per_s"] for rep in rec["per_repeat"]]
                agrees(cell, [rec["tokens_per_s_vs_none"][p["name"]]] + (per if "(" in cell else []), what)
            elif col == "mean acceptance length":
                if p["mean_acceptance_length"] is None:
                    assert cell == "-", what
                else:
                    agrees(cell, [p["mean_acceptance_length"]], what)
            elif col == "acceptance rate":
                if p["acceptance_rate"] is None:
                    assert cell == "-", what
                else:
                    agrees(cell, [p["acceptance_rate"]], what)
            elif col == "output tokens":
                agrees(cell, [p["output_tokens"]], what)
            elif col == "wall s":
                agrees(cell, [p["wall_s"]], what)


# ---------------------------------------------------------------- bench.sim

SCENARIOS = {"Moonlight": "moonlight", "Qwen2-VL-72B": "qwen2vl72b", "Kimi-K2": "kimik2"}


def test_sim_ablation_table_matches_the_recording():
    header, rows = table_after(ROOT / "docs" / "bench.md", "### Current result", "scenario | divided | context")
    rec = load("sim/sim_ablation.json")["scenarios"]
    cols = {"divided": "divided", "context": "context", "grouped SD": "grouped_sd", "oracle": "oracle"}
    assert len(rows) == 3
    for row in rows:
        name = SCENARIOS[label(row[0]).split(" (")[0]]
        configs = rec[name]["configs"]
        for col, cell in zip(header[1:], row[1:]):
            if col in cols:
                agrees(cell, [configs[cols[col]]["ratio"]], f"docs/bench.md sim {name} {col}")
            elif col == "context / oracle":
                agrees(cell, [configs["context"]["tokens_per_s"] / configs["oracle"]["tokens_per_s"]],
                       f"docs/bench.md sim {name} {col}")


def test_readme_quotes_the_simulated_full_seer_of_the_recording():
    rec = load("sim/sim_ablation.json")["scenarios"]
    m = re.search(r"Full Seer simulates at ([\d.]+)x /\s+([\d.]+)x /\s+([\d.]+)x", (ROOT / "README.md").read_text())
    assert m, "README no longer quotes the simulated full Seer"
    for got, name in zip(m.groups(), ("moonlight", "qwen2vl72b", "kimik2")):
        agrees(got, [rec[name]["configs"]["grouped_sd"]["ratio"]], f"README full Seer {name}")


# ---------------------------------------------------------------- seer-bench weight-push

def test_weights_doc_table_matches_the_recording():
    header, rows = table_after(ROOT / "docs" / "weights.md", "## Measured", "model | checkpoint MB")
    recorded = {(t["model"], t["placement"], t["transport"]): t for t in load("weight_push/weight_push.json")["table"]}
    place = {"one node (2 instances)": "one_node", "two nodes (1 instance each)": "two_nodes"}
    assert len(rows) == len(recorded) == 8
    for row in rows:
        r = dict(zip(header, row))
        t = recorded[(r["model"], place[r["placement"]], r["transport"])]
        what = f"docs/weights.md {r['model']} {r['placement']} {r['transport']}"
        agrees(r["checkpoint MB"], [t["bytes"] / 1e6], what)
        agrees(r["push s"], [t["push_s_median"]], what)
        agrees(r["GB/s per instance"], [t["gb_per_s_per_instance_median"]], what)
        if t["delivery_s_median"] is None:
            assert r["delivery s per node"] == "-", what
        else:
            agrees(r["delivery s per node"], [t["delivery_s_median"]], what)


# ---------------------------------------------------------------- multi-turn

MULTITURN_COLUMNS = {  # header -> recorded keys (in the order the cell shows them), scale
    "model tok/s (min-max)": (("tokens_per_s", "tokens_per_s_min", "tokens_per_s_max"), 1.0),
    "vs sticky": (("ratio",), 1.0),
    "wall s / iteration": (("wall_s_per_iteration",), 1.0),
    "tail s (min-max)": (("tail_s", "tail_s_min", "tail_s_max"), 1.0),
    "idle": (("idle_fraction",), 100.0),
    "idle while tools run": (("idle_while_tools_fraction",), 100.0),
    "history tokens / turn": (("history_tokens_per_turn",), 1.0),
    "cached / recomputed per turn": (("cached_tokens_per_turn", "recomputed_tokens_per_turn"), 1.0),
    "from the pool / turn": (("pool_tokens_per_turn",), 1.0),
    "turns moved": (("moved_turns_share",), 100.0),
}


def check_multiturn_table(doc: Path, anchor: str, header_starts: str, recorded: str, columns: dict) -> None:
    header, rows = table_after(doc, anchor, header_starts)
    configs = {r["label"]: r for r in load(recorded)["configs"].values()}
    assert len(rows) >= 3
    for row in rows:
        name = label(row[0])
        assert name in configs, f"{doc.name}: row {name!r} is not a configuration of {recorded}"
        rec = configs[name]
        for col, cell in zip(header[1:], row[1:]):
            if col == "off-policy share":
                ap = rec.get("april")
                if ap is None:
                    assert "on-policy" in cell, f"{name}: {cell!r}"
                else:
                    agrees(cell.replace("after it 0", "after"), [ap["off_policy_share"], ap["off_policy_share_after_first"]],
                           f"{name} {col}", 100.0)
            elif col in columns:
                keys, scale = columns[col]
                agrees(cell, [rec[k] for k in keys], f"{doc.name} {name} {col}", scale)


def test_multiturn_doc_table_matches_the_recording():
    check_multiturn_table(ROOT / "docs" / "multiturn.md", "### Multi-turn comparison", "configuration | model tok/s",
                          "multiturn_compare/multiturn_compare.json", MULTITURN_COLUMNS)


def test_multiturn_doc_simulated_table_matches_the_recording():
    columns = {"throughput vs sticky (min-max)": (("ratio", "ratio_min", "ratio_max"), 1.0),
               "wall s": (("wall_s",), 1.0), "tail s": (("tail_s",), 1.0), "idle": (("idle_fraction",), 100.0),
               "idle while tools run": (("idle_while_tools_fraction",), 100.0),
               "history tokens / turn": (("history_tokens_per_turn",), 1.0),
               "recomputed / turn": (("recomputed_tokens_per_turn",), 1.0),
               "from the pool / turn": (("pool_tokens_per_turn",), 1.0),
               "turns moved": (("moved_turns_share",), 100.0)}
    check_multiturn_table(ROOT / "docs" / "multiturn.md", "### Multi-turn comparison", "configuration | throughput vs sticky",
                          "sim/sim_multiturn.json", columns)


# ---------------------------------------------------------------- trainer: packed and tree batches

def test_trainer_doc_tree_table_matches_the_recording():
    header, rows = table_after(ROOT / "docs" / "trainer.md", "### Packed and tree batches, measured",
                               "workload | layout | tokens computed")
    recorded = load("trainer_tree/trainer_tree.json")["workloads"]
    assert len(rows) == 3 * len(recorded)
    for row in rows:
        r = dict(zip(header, row))
        w, layout = recorded[label(r["workload"])], label(r["layout"])
        rec, what = w["layouts"][layout], f"docs/trainer.md {r['workload']} {layout}"
        agrees(r["tokens computed"], [rec["computed_tokens"]], what)
        agrees(r["x fewer than padded"], [w["tokens_fewer_than_padded"][layout]], what)
        agrees(r["step s (median)"], [rec["step_s"]], what)
        agrees(r["x faster than padded"], [w["speedup_vs_padded"][layout]], what)
        agrees(r["tokens/s per core"], [rec["tokens_per_s_per_core"]], what)


# ---------------------------------------------------------------- bench.agent_gateway

AGENT_GATEWAY_COLUMNS = {
    "model tok/s (min-max)": ("model_tokens_per_s", "model_tokens_per_s_min", "model_tokens_per_s_max"),
    "vs env": ("vs_env",),
    "calls / iteration": ("calls_per_iteration",),
    "gateway ms / call": ("gateway_ms_per_call",),
}


@pytest.mark.parametrize("anchor, recording", [
    ("### The gateway against the Environment", "agent_gateway/agent_gateway.json"),
    ("### At a larger model's cost", "agent_gateway/agent_gateway_1024x8.json")])
def test_agents_doc_gateway_table_matches_the_recording(anchor, recording):
    """docs/agents.md's comparisons of the gateway and the Environment show their recordings' numbers."""
    header, rows = table_after(ROOT / "docs" / "agents.md", anchor, "configuration | model tok/s")
    rec = load(recording)
    assert {label(r[0]).strip("`") for r in rows} == set(rec["configs"])
    for row in rows:
        name = label(row[0]).strip("`")
        for col, cell in zip(header[1:], row[1:]):
            if col == "same tokens as env":
                if name == "env":
                    assert cell == "-", f"env: {cell!r}"
                else:
                    t = rec["same_tokens"][name]
                    agrees(cell, [t["same"], t["samples"]], f"agents.md {name} {col}")
            elif col in AGENT_GATEWAY_COLUMNS:
                values = [rec["configs"][name].get(k) for k in AGENT_GATEWAY_COLUMNS[col]]
                if values[0] is None:
                    assert cell == "-", f"agents.md {name} {col}: {cell!r}, recorded none"
                else:
                    agrees(cell, values, f"agents.md {name} {col}")


# ---------------------------------------------------------------- bench.models (families end to end)

FLOAT = re.compile(r"[-+]?\d+\.\d+(?:e[-+]\d+)?")  # signed, maybe scientific: "+0.125", "3.50e-07"


def close_as_shown(cell: str, expected: list[float | None], what: str) -> None:
    """Each number of `cell` (signs and exponents kept) equals the recorded one at the digits shown;
    a recorded None shows as '-'."""
    got = FLOAT.findall(cell)
    want = [e for e in expected if e is not None]
    assert len(got) == len(want), f"{what}: {cell!r} shows {len(got)} numbers, the record has {len(want)}"
    for s, e in zip(got, want):
        mant, _, exp = s.partition("e")
        step = 10 ** (-len(mant.split(".")[1]) + (int(exp) if exp else 0))
        assert abs(float(s) - e) <= 0.5 * step + 1e-15, f"{what}: {cell!r} shows {s}, the recorded file has {e!r}"


def test_models_doc_families_table_matches_the_recording():
    """docs/models.md's per-family measurements show models/families/models.json's numbers."""
    header, rows = table_after(ROOT / "docs" / "models.md", "## Measured", "family | preset")
    rec = {r["family"]: r for r in load("models/families/models.json")["families"]}
    assert {label(r[0]) for r in rows} == set(rec)
    for row in rows:
        r, f = dict(zip(header, row)), rec[label(row[0])]
        what = f"docs/models.md {label(row[0])}"
        assert r["preset"].strip("`") == f["preset"], what
        close_as_shown(r["iteration 0 mismatch mean / max"], [f.get("mismatch_mean_iter0"), f.get("mismatch_max_iter0")], what)
        close_as_shown(r["every iteration mismatch mean / max"], [f.get("mismatch_mean_all"), f.get("mismatch_max_all")], what)
        close_as_shown(r["train step s"], [f.get("train_s_mean")], what)
        for col, arm in (("reward per iteration, trained", "trained"), ("reward per iteration, lr=0", "control")):
            a = f.get(arm)
            close_as_shown(r[col], a["summary"]["reward"] if a and a["summary"] else [], f"{what} {col}")
