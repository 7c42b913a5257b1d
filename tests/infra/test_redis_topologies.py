"""Shared state on a real Redis Cluster (3 masters, 3 replicas) and on a Sentinel-managed
primary/replica, selected by the URL's scheme. Under load, the master holding the deferred queue
(cluster) or the primary (Sentinel) is killed with SIGKILL: no request fails, no deferred request
is lost (each one is replayed and its answer fetched), and the gateway writes to the promoted
replica afterwards.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from loadtests.redis_topology import missing_binaries, redis_cluster, redis_sentinel
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

pytestmark = pytest.mark.skipif(missing_binaries() is not None, reason=str(missing_binaries()))

CLUSTER_PORTS = list(range(7000, 7006))
SENTINEL = (7010, 7011, [7020])
RULES = """
rules:
  - name: later
    match: {aliases: [later]}
    queue: true
    template: "Queued as {request_id}."
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator:
    with redis_cluster(CLUSTER_PORTS, tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory) -> Iterator:
    primary, replica, sentinels = SENTINEL
    with redis_sentinel(primary, replica, sentinels, tmp_path_factory.mktemp("sentinel")) as s:
        yield s


def policy(fleet: Fleet, rules: Path) -> str:
    return f"""
providers:
  ok: {{base_url: "{fleet.url("a")}"}}
  down: {{base_url: "{fleet.url("c")}", breaker: {{cooldown_s: 0.2, max_cooldown_s: 0.4}}}}
pools:
  main: {{members: [ok]}}
  spare: {{members: [down], max_attempts: 1}}
degradation: {{rules: "{rules}"}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: true, ttl_s: 60}}}}}}
  later: {{pool: spare}}
"""


class Load:
    """Clients sending cacheable chat requests (Redis on the request path: the exact cache)
    and, from one of them, requests that degrade into the deferred queue."""

    def __init__(self, base_url: str, clients: int = 4) -> None:
        self.base_url = base_url
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.deferred: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]
        self.slowest = 0.0

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _run(self, index: int) -> None:
        n = 0
        with httpx.Client(base_url=self.base_url, timeout=20) as client:
            while not self.stop.is_set():
                n += 1
                later = index == 0 and len(self.deferred) < 8
                body = {
                    "model": "later" if later else "chat",
                    "temperature": 0,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"question {n % 5}"}],
                }
                t0 = time.monotonic()
                try:
                    r = client.post("/chat/completions", json=body)
                    self.slowest = max(self.slowest, time.monotonic() - t0)
                except httpx.HTTPError as e:
                    self.errors.append(repr(e))
                    continue
                self.statuses.append(r.status_code)
                if r.status_code != 200:
                    self.errors.append(r.text[:200])
                elif later:
                    assert r.headers.get("x-gateway-deferred"), r.headers
                    self.deferred.append(r.headers["x-gateway-deferred"])
                time.sleep(0.3 if later else 0.01)


def run_failover(
    fleet: Fleet, tmp_path: Path, url: str, kill: Callable[[str], None], monkeypatch
) -> tuple[GatewayServer, str]:
    """Serve over `url`, load it, `kill(prefix)` mid-load; returns the gateway and its prefix."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(RULES)
    prefix = f"gwtopo:{uuid.uuid4().hex[:6]}:"
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", prefix)
    fleet.set_faults("c", error_rate=1.0, error_status=[503])
    gw = GatewayServer(policy(fleet, tmp_path / "rules"), redis_url=url)
    gw.__enter__()
    try:
        with Load(gw.base_url) as load:
            time.sleep(1.0)
            kill(prefix)
            time.sleep(2.5)
        assert load.errors == [], load.errors[:5]
        assert len(load.statuses) > 50 and set(load.statuses) == {200}
        assert len(load.deferred) >= 4, (load.deferred, load.slowest)
        # The provider comes back: every deferred request is replayed and its answer fetched.
        fleet.clear_faults("c")
        pending = set(load.deferred)
        deadline = time.monotonic() + 40
        while pending and time.monotonic() < deadline:
            for rid in list(pending):
                r = httpx.get(f"{gw.base_url}/gateway/deferred/{rid}", timeout=5)
                assert r.status_code == 200, (rid, r.text)
                if r.json()["status"] == "done":
                    pending.discard(rid)
            time.sleep(0.3)
        assert not pending, f"{len(pending)} deferred requests never answered"
    except BaseException:
        gw.__exit__(None, None, None)
        raise
    return gw, prefix


def defer_one(gw: GatewayServer, fleet: Fleet) -> str:
    fleet.set_faults("c", error_rate=1.0, error_status=[503])
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "later", "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    return r.headers["x-gateway-deferred"]


def wait_key(client: redis.Redis | redis.RedisCluster, key: str, what: str) -> None:
    deadline = time.monotonic() + 10
    while client.get(key) is None:
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_cluster_master_killed_under_load(fleet, cluster, tmp_path, monkeypatch) -> None:
    killed: list[int] = []

    def kill(prefix: str) -> None:
        # The deferred queue's keys share one slot (hash tag): kill the master serving it.
        port = cluster.master_of("{" + prefix + "deferred}:replay")
        killed.append(port)
        cluster.kill(port)

    gw, prefix = run_failover(fleet, tmp_path, cluster.url, kill, monkeypatch)
    try:
        stream = gw.app.state.pipeline.degradation.queue.stream
        assert stream == "{" + prefix + "deferred}:replay"
        cluster.wait_healthy()
        assert cluster.master_of(stream) != killed[0]  # a replica took the slots over
        # The gateway writes to the cluster again: a new deferred request lands there.
        rid = defer_one(gw, fleet)
        with cluster.client() as c:
            wait_key(c, "{" + prefix + "deferred}:result:" + rid, "no result key in the cluster")
    finally:
        fleet.clear_faults("c")
        gw.__exit__(None, None, None)


def test_sentinel_primary_killed_under_load(fleet, sentinel, tmp_path, monkeypatch) -> None:
    def kill(_prefix: str) -> None:
        sentinel.kill(sentinel.primary)

    gw, prefix = run_failover(fleet, tmp_path, sentinel.url, kill, monkeypatch)
    try:
        deadline = time.monotonic() + 10
        while sentinel.current_primary() != sentinel.replica:
            assert time.monotonic() < deadline, "no failover"
            time.sleep(0.1)
        rid = defer_one(gw, fleet)
        with redis.Redis(port=sentinel.replica) as promoted:
            key = "{" + prefix + "deferred}:result:" + rid
            wait_key(promoted, key, "no result key on the promoted replica")
    finally:
        fleet.clear_faults("c")
        gw.__exit__(None, None, None)


def test_governance_scripts_run_on_the_cluster(fleet, cluster, monkeypatch) -> None:
    """Rate-limit and concurrency scripts touch several keys at once: on a cluster they must
    hash to one slot (`{prefix gov}` tag), or Redis refuses them (CROSSSLOT) and limits would
    stay per process."""
    prefix = f"gwgov:{uuid.uuid4().hex[:6]}:"
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team:team-key")
    text = f"""
governance:
  tenants:
    team: {{limits: {{requests_per_minute: 600, tokens_per_minute: 100000, max_concurrent: 50}}}}
providers:
  ok: {{base_url: "{fleet.url("a")}"}}
pools:
  main: {{members: [ok]}}
models:
  chat: {{pool: main}}
"""
    with GatewayServer(text, redis_url=cluster.url) as gw, cluster.client() as c:
        deadline = time.monotonic() + 15
        while True:
            r = httpx.post(
                f"{gw.base_url}/chat/completions",
                headers={"authorization": "Bearer team-key"},
                json={
                    "model": "chat",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "x"}],
                },
                timeout=10,
            )
            assert r.status_code == 200, r.text
            keys = {k.decode() for k in c.scan_iter(match="{" + prefix + "gov}:*")}
            if any(":rl:" in k for k in keys) and any(":cc:" in k for k in keys):
                break
            assert time.monotonic() < deadline, keys
            time.sleep(0.1)


async def test_semantic_store_writes_scans_and_publishes_on_the_cluster(cluster) -> None:
    """The semantic cache's entries are spread over the cluster's slots: a rebuild scans every
    master, and new entries reach other replicas over pub/sub."""
    import asyncio

    import numpy as np

    from gateway.cache.semantic_index import Entry
    from gateway.cache.semantic_store import RedisSemanticStore
    from gateway.infra.redis_client import make_redis

    prefix = f"gwsem:{uuid.uuid4().hex[:6]}:"

    def store(origin: str) -> RedisSemanticStore:
        client = make_redis(cluster.url, socket_timeout=2)
        return RedisSemanticStore(
            client, prefix=prefix, channel=prefix + "new", model_id="m", origin=origin
        )

    writer, reader = store("one"), store("two")
    got: list[str] = []
    ready = asyncio.Event()

    async def on_entries(entries: list[Entry]) -> None:
        got.extend(e.entry_id for e in entries)

    async def on_subscribed() -> None:
        return None

    listener = asyncio.create_task(reader.listen(on_entries, on_subscribed, ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        vector = np.ones(4, dtype=np.float32) / 2
        ids = [f"e{i}" for i in range(30)]
        for i in ids:
            entry = Entry(i, "ns", f"question {i}", vector, b"{}", time.time() + 60)
            assert await writer.put(entry, 60)
        masters = {cluster.master_of(prefix + i) for i in ids}
        assert len(masters) == 3  # the entries really are spread over the masters
        scanned = [e.entry_id async for batch in reader.scan() for e in batch]
        assert sorted(scanned) == sorted(ids)
        deadline = time.monotonic() + 10
        while len(got) < len(ids):
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.05)
        assert sorted(got) == sorted(ids)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
