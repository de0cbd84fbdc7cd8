"""bench.compare's pieces that need no vLLM: presets, configuration names, the time breakdown."""

import pytest

from bench.harness.breakdown import breakdown, metric_totals
from bench.compare import command_line, parse
from seer.sim.ladder import select
from seer.scheduler.events import ChunkEvent


def test_preset_sets_the_workload_and_flags_override_it():
    s = parse(["--preset", "default-longtail"])
    assert (s.model, s.groups, s.group_size, s.max_tokens, s.chunk_size) == ("default", 16, 16, 2048, 256)
    assert s.kv_cache_bytes == 32 << 20 and s.max_num_seqs == 256 and s.mode == "replay"
    assert command_line(s) == "python -m bench.compare --preset default-longtail"
    s = parse(["--preset", "default-longtail", "--repeats", "5"])
    assert s.repeats == 5 and command_line(s) == "python -m bench.compare --preset default-longtail --repeats 5"
    d = parse([])  # no flags: the default workload and the whole ladder
    assert d.preset == "default" and d.model == "default" and d.configs == "all" and d.group_size == 16 and d.kv_pool
    assert not parse(["--preset", "default-longtail"]).kv_pool
    assert command_line(d) == "python -m bench.compare"
    assert command_line(parse(["--repeats", "2"])) == "python -m bench.compare --repeats 2"
    assert parse(["--preset", "tiny"]).model == "tiny"  # the CompareSettings defaults
    assert parse(["--kv-pool", "true"]).kv_pool and not parse(["--kv-pool", "false"]).kv_pool
    with pytest.raises(SystemExit):
        parse(["--kv-pool", "maybe"])
    with pytest.raises(SystemExit):
        parse(["--preset", "nope"])


def test_config_names_take_a_chunk_size():
    cs = select("context@128,baseline,context")
    assert [c.name for c in cs] == ["baseline", "context", "context@128"]
    assert cs[2].policy == "context" and cs[2].chunk_size == 128 and cs[1].chunk_size is None
    for bad in ("nope", "context@", "context@-3"):
        with pytest.raises(ValueError):
            select(bad)


def test_config_names_take_scheduler_settings():
    cs = select("baseline,context@128+engine_priority=true+starvation_every=8,context+early_packing=0")
    assert [c.name for c in cs] == ["baseline", "context@128+engine_priority=true+starvation_every=8",
                                    "context+early_packing=0"]
    assert cs[1].chunk_size == 128 and cs[1].sched == (("engine_priority", True), ("starvation_every", 8))
    assert cs[2].chunk_size is None and cs[2].sched == (("early_packing", False),)
    assert "engine_priority=True" in cs[1].label
    # unknown fields, bad values and the fields the configuration and benchmark own are refused by name
    for bad, names in (("context+nope=1", "nope"), ("context+early_packing=maybe", "true or false"),
                       ("context+chunk_size=64", "chunk_size"), ("context+policy=divided", "policy"),
                       ("context+starvation_every=x", "number")):
        with pytest.raises(ValueError, match=names):
            select(bad)


def _chunk(rid, k, inst, t0, t1, *, prompt, cached, new, migrated=False, e2e_pad=0.0):
    return ChunkEvent(rid, f"{rid}-c{k}", 0, 0, k, inst, "fifo", 256, 512, prompt, cached, new, "length",
                      migrated, t0, t1, 100.0 + t0, 100.0 + t1, False)


def test_breakdown_of_hand_made_chunks():
    chunks = [
        _chunk("a", 0, "i0", 0.0, 4.0, prompt=60, cached=0, new=197),
        _chunk("a", 1, "i0", 4.5, 8.0, prompt=257, cached=256, new=256),  # stayed: prefix cached
        _chunk("b", 0, "i1", 0.0, 2.0, prompt=60, cached=0, new=197),
        _chunk("b", 1, "i0", 3.0, 6.0, prompt=257, cached=0, new=100, migrated=True),
    ]
    text = lambda steps, tokens, e2e: (  # noqa: E731
        f'vllm:iteration_tokens_total_count{{engine="0"}} {steps}\n'
        f'vllm:iteration_tokens_total_sum{{engine="0"}} {tokens}\n'
        f'vllm:iteration_tokens_total_bucket{{le="1"}} 99\n'
        f'vllm:e2e_request_latency_seconds_sum{{engine="0"}} {e2e}\n'
        'vllm:num_preemptions_total{engine="0"} 0\n')
    before = {"i0": metric_totals(text(0, 0, 0)), "i1": metric_totals(text(0, 0, 0))}
    after = {"i0": metric_totals(text(400, 8000, 10.0)), "i1": metric_totals(text(100, 1000, 1.9))}
    b = breakdown(chunks, 0.0, 10.0, before, after)
    i0, t = b["instances"]["i0"], b["total"]
    assert i0["busy_s"] == pytest.approx(8.0) and i0["idle_s"] == pytest.approx(2.0)
    assert i0["concurrency"] == pytest.approx((4 + 3.5 + 3) / 8)
    assert i0["engine_steps"] == 400 and i0["tokens_per_step"] == pytest.approx(20)
    assert i0["ms_per_step"] == pytest.approx(20)
    assert (i0["stayed_chunks"], i0["stayed_prefix_cached"], i0["moved_chunks"]) == (1, 256, 1)
    assert i0["http_overhead_ms_per_chunk"] == pytest.approx(1e3 * (10.5 - 10.0) / 3)
    assert t["requeued_chunks"] == 2 and t["gap_mean_ms"] == pytest.approx(750)  # 0.5 s and 1.0 s


def test_longest_request_is_the_critical_path():
    chunks = [
        _chunk("a", 0, "i0", 1.0, 4.0, prompt=60, cached=0, new=197),
        _chunk("a", 1, "i1", 4.5, 8.0, prompt=257, cached=0, new=256, migrated=True),
        _chunk("b", 0, "i1", 0.0, 2.0, prompt=60, cached=0, new=100),
    ]
    lr = breakdown(chunks, 0.0, 10.0, {}, {})["total"]["longest_request"]
    assert (lr["request"], lr["tokens"], lr["chunks"], lr["instances"]) == ("a", 453, 2, ["i0", "i1"])
    assert (lr["first_dispatch_s"], lr["finish_s"], lr["between_chunks_s"]) == (1.0, 8.0, 0.5)
