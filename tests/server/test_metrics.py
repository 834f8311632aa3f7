"""The server's Prometheus metrics, read back through the text exposition format."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tierserve.server.runtime.metrics import ServerMetrics


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_requests_errors_and_batches_are_counted_per_model_and_protocol():
    m = ServerMetrics()
    m.observe_request("dlrm", "http", 0.003)
    m.observe_request("dlrm", "http", 0.004, status="400")
    m.observe_request("dlrm", "grpc", 0.001)
    m.observe_batch("dlrm", 64, 5)
    s = _samples(m)
    http = (("model", "dlrm"), ("protocol", "http"))
    assert s[("tierserve_requests_total", http)] == 2
    assert s[("tierserve_request_errors_total", (*http, ("status", "400")))] == 1
    assert s[("tierserve_request_latency_seconds_count", http)] == 2
    assert abs(s[("tierserve_request_latency_seconds_sum", http)] - 0.007) < 1e-9
    assert s[("tierserve_requests_total", (("model", "dlrm"), ("protocol", "grpc")))] == 1
    assert s[("tierserve_batch_size_sum", (("model", "dlrm"),))] == 64
    assert s[("tierserve_batch_requests_sum", (("model", "dlrm"),))] == 5


def test_cache_and_tier_sources_are_read_at_every_scrape():
    m = ServerMetrics()
    rate = {"value": 0.25}
    m.add_source(lambda: [{"model": "dlrm", "cache_hit_rate": {"t1": rate["value"]}}])
    tiers = {
        "volatile": {
            "tier": "redis",
            "hits": 10,
            "misses": 3,
            "errors": 1,
            "skipped": 7,
            "latency": {"lookup": {"buckets": [(0.001, 4), (float("inf"), 5)], "sum": 0.01}},
            "updates": {"messages": 2, "malformed": 1},
            "consumers": [
                {"role": "apply", "alive": True, "restarts": 1},
                {"role": "invalidate", "alive": False, "restarts": 3},
            ],
        }
    }
    m.add_tier_source(lambda: tiers)
    s = _samples(m)
    assert s[("tierserve_cache_hit_rate", (("model", "dlrm"), ("table", "t1")))] == 0.25
    tier = (("tier", "volatile:redis"),)
    assert s[("tierserve_tier_hits_total", tier)] == 10
    assert s[("tierserve_tier_misses_total", tier)] == 3
    assert s[("tierserve_tier_errors_total", tier)] == 1
    assert s[("tierserve_tier_skipped_total", tier)] == 7
    assert s[("tierserve_tier_latency_seconds_count", (("op", "lookup"), *tier))] == 5
    assert s[("tierserve_tier_updates_total", (("outcome", "malformed"), *tier))] == 1
    assert s[("tierserve_update_consumers_alive", (("role", "apply"), *tier))] == 1
    assert s[("tierserve_update_consumers_alive", (("role", "invalidate"), *tier))] == 0
    assert s[("tierserve_update_consumer_restarts_total", (("role", "invalidate"), *tier))] == 3
    rate["value"] = 0.75
    tiers["volatile"]["hits"] = 11
    s = _samples(m)
    assert s[("tierserve_cache_hit_rate", (("model", "dlrm"), ("table", "t1")))] == 0.75
    assert s[("tierserve_tier_hits_total", tier)] == 11
