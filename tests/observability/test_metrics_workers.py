"""`gateway serve --workers 2`: one scrape of /metrics reports the requests of both workers,
histograms included, whichever worker answers it."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.metrics_workers import merge
from tests.support import gateway_process

N = 60


def policy(url: str) -> str:
    return f"""
providers:
  slow: {{base_url: "{url}"}}
pools:
  main: {{members: [slow]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
"""


def totals(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("gateway_requests_total", "gateway_request_duration_seconds_count"):
                out[s.name] = out.get(s.name, 0) + s.value
            if s.name == "gateway_request_duration_seconds_bucket" and s.labels["le"] == "+Inf":
                out["inf_bucket"] = out.get("inf_bucket", 0) + s.value
            if s.name == "process_resident_memory_bytes":
                out["rss"] = s.value
    return out


def one_request(base: str) -> int:
    # A new connection per request, sent together: both workers accept some.
    body = {"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=30).status_code


def test_one_scrape_reports_every_worker(tmp_path, fleet, monkeypatch) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy(fleet.url("slow")))
    folder = tmp_path / "metrics"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    monkeypatch.setenv("GATEWAY_METRICS_SNAPSHOT_S", "0.2")
    with gateway_process(path, workers=2) as base:
        root = base.removesuffix("/v1")
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            assert set(pool.map(one_request, [base] * N)) == {200}
        time.sleep(0.6)  # every worker wrote a snapshot since
        # Both workers served (each snapshot holds only its own worker's figures)...
        per_worker = []
        for f in folder.glob("worker-*.json"):
            doc = orjson.loads(f.read_bytes())
            doc["live"] = True
            fams = {m.name: m for m in merge([doc])}
            per_worker.append(sum(s.value for s in fams["gateway_requests"].samples))
        assert len(per_worker) == 2 and all(n > 0 for n in per_worker), per_worker
        # ...and every scrape, whichever worker answers, reports all of them.
        for _ in range(6):
            t = totals(httpx.get(f"{root}/metrics", timeout=5).text)
            assert t["gateway_requests_total"] == N
            assert t["gateway_request_duration_seconds_count"] == N
            assert t["inf_bucket"] == N
            assert t["rss"] > 2 * 20e6  # two workers' memory


def test_merge_rules() -> None:
    """Counters add up over every worker (a dead one's included); gauges only over live ones;
    breaker state is "any worker"."""

    def snap(live: bool, requests: float, inflight: float, open_: float) -> dict:
        return {
            "live": live,
            "families": [
                [
                    "gateway_requests",
                    "counter",
                    "d",
                    [["gateway_requests_total", {"a": "x"}, requests]],
                ],
                [
                    "gateway_member_inflight",
                    "gauge",
                    "d",
                    [["gateway_member_inflight", {}, inflight]],
                ],
                [
                    "gateway_breaker_state",
                    "gauge",
                    "d",
                    [["gateway_breaker_state", {"state": "open"}, open_]],
                ],
            ],
        }

    fams = {
        m.name: m for m in merge([snap(True, 3, 2, 0), snap(True, 4, 5, 1), snap(False, 10, 7, 1)])
    }
    assert [s.value for s in fams["gateway_requests"].samples] == [17]
    assert [s.value for s in fams["gateway_member_inflight"].samples] == [7]
    assert [s.value for s in fams["gateway_breaker_state"].samples] == [1]
