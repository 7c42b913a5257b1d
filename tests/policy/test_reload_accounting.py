"""Two reloads in quick succession under load: no 500, and every request accounted once.

`gateway serve` as users run it, a mixed load (plain answers, streams read to the end, streams the
client abandons after the first chunk), and two reloads that each replace a provider's connection
pool, the second well within `total_s` of the first. Every request must get an answer that is not a
500, exactly one access-log line and exactly one metrics observation.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.simulator.testing import Fleet
from tests.policy.test_reload import serve, write_atomic

# ~0.8 s per answer: answers begun on the pool the second reload retires (1 s after the first)
# are still in flight when the first reload's delayed clean-up (total_s after it) used to close
# every retired pool.
SLOW = {"decode_tps_alone": 25, "decode_tps_full": 25}


FLEET: list[Any] = [{"name": n, "profile": "fast", "overrides": SLOW} for n in ("a", "b")]


def policy(fleet: Fleet, version: int) -> str:
    # The header changes the providers' configuration: each reload retires both pools.
    provider = "{{base_url: '{url}', headers: {{x-policy: 'v{v}'}}, timeouts: {{total_s: 1.5}}}}"
    return f"""
providers:
  a: {provider.format(url=fleet.url("a"), v=version)}
  b: {provider.format(url=fleet.url("b"), v=version)}
pools:
  main: {{members: [a, b]}}
models:
  chat: {{pool: main}}
"""


def client_loop(url: str, seed: int, stop: threading.Event, sent: list[tuple[str, int]]) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=20) as client:
        while not stop.is_set():
            kind = rng.choice(("unary", "stream", "abandon"))
            body = {
                "model": "chat",
                "messages": [{"role": "user", "content": f"{seed} {rng.random()}"}],
                "max_tokens": 20,
                "stream": kind != "unary",
            }
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if kind == "abandon":
                    next(r.iter_bytes(), None)  # first chunk, then hang up
                    sent.append((kind, r.status_code))
                    continue
                raw = r.read()
                complete = raw.rstrip().endswith(b"[DONE]") if kind == "stream" else True
                sent.append((kind, r.status_code if complete else -1))


def access_lines(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"request_id"' in line:
            out.append(json.loads(line))
    return out


def metric_count(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("gateway_requests_total{")
    )


def test_two_quick_reloads_under_load_every_request_answered_and_recorded_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy(fleet, 1))
    log = tmp_path / "gateway.log"
    with serve(path, log) as gw:
        stop = threading.Event()
        sent: list[tuple[str, int]] = []
        threads = [
            threading.Thread(target=client_loop, args=(gw.url, i, stop, sent)) for i in range(8)
        ]
        for t in threads:
            t.start()
        time.sleep(0.8)
        for version in (2, 3):  # 1 s apart, total_s is 1.5 s
            write_atomic(path, policy(fleet, version))
            assert httpx.post(f"{gw.url}/admin/reload", timeout=10).json()["reloaded"]
            time.sleep(1.0)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
        n = len(sent)
        assert n > 30
        statuses = {s for _, s in sent}
        assert statuses == {200}, sorted(sent)  # -1: a stream that ended without [DONE]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            lines, observed = access_lines(log), metric_count(gw.url)
            if len(lines) >= n and observed >= n:
                break
            time.sleep(0.1)
        time.sleep(0.3)  # nothing more may arrive
        lines, observed = access_lines(log), metric_count(gw.url)
        assert len(lines) == n, (len(lines), n)
        assert len({rec["request_id"] for rec in lines}) == n
        assert observed == n
        assert not [rec for rec in lines if rec["status"] >= 500]
        assert not [rec for rec in lines if any("attempt_error" in f for f in rec["failures"])]
        abandoned = sum(kind == "abandon" for kind, _ in sent)
        assert sum(rec["status"] == 499 for rec in lines) <= abandoned
