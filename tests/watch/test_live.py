"""The live /metrics endpoint on loopback: Prometheus text a scraper reads, values that follow the run."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from seer.scheduler.events import Progress
from seer.watch.live import LiveMetrics


def scrape(url: str) -> dict:
    """(sample name, sorted labels) -> value, read by prometheus_client's own parser (a scraper's)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_endpoint_follows_the_rollout_and_the_iteration():
    live = LiveMetrics("127.0.0.1", 0)
    try:
        assert live.url.startswith("http://127.0.0.1:") and live.port > 0
        live.start_rollout(3, 64)
        live.set_phase("rollout")
        live.rollout_progress(Progress(10, 64, 5, 1200, 2.0, queued=49, migrated=2,
                                       instances=(("inst0", 0.25, 3), ("inst1", 0.5, 2))))
        first = scrape(live.url)
        live.rollout_progress(Progress(64, 64, 0, 5000, 4.0, queued=0, migrated=4,
                                       instances=(("inst0", 0.0, 0), ("inst1", 0.1, 0))))
        live.set_phase("training")
        live.iteration_done({"reward_mean": 0.42}, 4)
        second = scrape(live.url)
    finally:
        live.close()
    assert first[("seer_rollout_output_tokens", ())] == 1200 and first[("seer_rollout_tokens_per_second", ())] == 600
    assert first[("seer_chunks_in_flight", ())] == 5 and first[("seer_requests_queued", ())] == 49
    assert first[("seer_instance_kv_usage", (("instance", "inst1"),))] == 0.5
    assert first[("seer_phase", (("phase", "rollout"),))] == 1 and first[("seer_iteration", ())] == 3
    assert second[("seer_rollout_finished_requests", ())] == 64 and second[("seer_chunks_migrated", ())] == 4
    assert second[("seer_phase", (("phase", "rollout"),))] == 0 and second[("seer_phase", (("phase", "training"),))] == 1
    assert second[("seer_last_reward_mean", ())] == 0.42 and second[("seer_weight_version", ())] == 4
    assert second[("seer_output_tokens_total", ())] == 5000
