"""Hot reload of the policy in a running `gateway serve` process.

Traffic keeps flowing while the policy file is rewritten (file watcher, SIGHUP, POST /admin/reload);
an invalid file is refused with its field paths and the running policy stays; latency estimates
survive a reload; with Redis, a reload on one replica reaches the others.

Some steps point the policy path at a symlink and rewrite the symlink's target in another folder:
the file watcher does not see that change (as on file systems without change events), so the
version can only come from the trigger the step tests (SIGHUP or the admin call).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from gateway.policy.loader import parse_policy, policy_fingerprint
from gateway.runtime import Runtime
from tests.support import free_port, wait_http

TIMEOUT = 20.0


@dataclass
class Served:
    """A `gateway serve` process: its URL, pid and log file."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def ready(self) -> dict:
        return httpx.get(f"{self.url}/ready", timeout=5).json()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _start(policy: Path, log: Path, env: dict[str, str] | None) -> Served:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            + ["--policy", str(policy), "--log-level", "warning"],
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Served(f"http://127.0.0.1:{port}", proc, log)


@contextlib.contextmanager
def serve_many(*specs: tuple[Path, Path, dict[str, str] | None]) -> Iterator[list[Served]]:
    """Like tests.support.gateway_process, but several start at once and each logs to a file
    the test can read."""
    started: list[Served] = []
    try:
        for policy, log, env in specs:
            started.append(_start(policy, log, env))
        for s in started:
            wait_http(f"{s.url}/health", s.proc)
        yield started
    finally:
        for s in started:
            s.proc.terminate()
        for s in started:
            try:
                s.proc.wait(10)
            except subprocess.TimeoutExpired:
                s.proc.kill()


@contextlib.contextmanager
def serve(policy: Path, log: Path, env: dict[str, str] | None = None) -> Iterator[Served]:
    with serve_many((policy, log, env)) as (one,):
        yield one


def policy_text(urls: dict[str, str], members: list[str], strategy: str = "p2c_peak_ewma") -> str:
    providers = "\n".join(
        f"  {n}: {{base_url: '{u}', models: {{'*': sim-{n}}}}}" for n, u in urls.items()
    )
    return f"""
providers:
{providers}
pools:
  main:
    members: [{", ".join(members)}]
    balancer: {{strategy: {strategy}}}
models:
  chat: {{pool: main}}
"""


def version_of(text: str) -> str:
    return policy_fingerprint(parse_policy(text))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def poll(check: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Traffic:
    """Client threads sending requests until stopped; every outcome is recorded."""

    url: str
    threads: int = 4
    results: list[tuple[float, int, str]] = field(default_factory=list)  # (sent, status, provider)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _run(self, i: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = {"model": "chat", "max_tokens": 4, "stream": n % 2 == 0}
                body["messages"] = [{"role": "user", "content": f"client {i} request {n}"}]
                sent = time.monotonic()
                try:
                    r = client.post("/chat/completions", json=body)
                    text = r.text
                    if r.status_code != 200 or (body["stream"] and "[DONE]" not in text):
                        self.errors.append(f"{r.status_code}: {text[:200]}")
                    self.results.append((sent, r.status_code, r.headers.get("x-gateway-provider")))
                except httpx.HTTPError as e:
                    self.errors.append(repr(e))
                time.sleep(0.01)

    def __enter__(self) -> Traffic:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(30)

    def providers_after(self, t0: float, want: int = 12) -> set[str]:
        """Providers of `want` requests sent after `t0` (waits for them)."""
        poll(lambda: sum(1 for s, _, _ in self.results if s > t0) >= want, "traffic")
        return {p for s, _, p in list(self.results) if s > t0}


@pytest.fixture(scope="module")
def urls(fleet) -> dict[str, str]:
    return {n: fleet.url(n) for n in ("a", "b", "c")}


def _apply(
    served: Served, traffic: Traffic, text: str, members: list[str], trigger: Callable[[], None]
) -> None:
    version = version_of(text)
    trigger()
    poll(lambda: served.ready()["policy_version"] == version, f"version {version}")
    assert traffic.providers_after(time.monotonic()) <= set(members)


def test_valid_swaps_under_load_fail_no_request(tmp_path, urls) -> None:
    watched, hidden = tmp_path / "watched", tmp_path / "hidden"
    watched.mkdir()
    hidden.mkdir()
    policy = watched / "policy.yaml"
    v1 = policy_text(urls, ["a"], "round_robin")
    policy.write_text(v1)
    with serve(policy, tmp_path / "gw.log") as served, Traffic(served.url + "/v1") as traffic:
        assert served.ready()["policy_version"] == version_of(v1)
        assert traffic.providers_after(time.monotonic()) == {"a"}
        # 1. The file watcher: the file is replaced (as editors and config maps do).
        v2 = policy_text(urls, ["b", "c"], "p2c_peak_ewma")
        _apply(served, traffic, v2, ["b", "c"], lambda: write_atomic(policy, v2))
        v3 = policy_text(urls, ["c"], "least_busy")
        _apply(served, traffic, v3, ["c"], lambda: write_atomic(policy, v3))
        # 2. SIGHUP, and 3. POST /admin/reload, with changes the watcher cannot see.
        target = hidden / "policy.yaml"
        target.write_text(v3)
        link = watched / ".link"
        link.symlink_to(target)
        applied = served.log_text().count("applied (version")
        os.replace(link, policy)
        # The watcher reloads the swap to a symlink (same content); wait for it to be done.
        poll(lambda: served.log_text().count("applied (version") > applied, "the watcher")
        v4 = policy_text(urls, ["a", "b"], "round_robin")
        write_atomic(target, v4)
        _apply(served, traffic, v4, ["a", "b"], lambda: served.proc.send_signal(signal.SIGHUP))
        v5 = policy_text(urls, ["b"], "weighted")
        write_atomic(target, v5)

        def admin() -> None:
            r = httpx.post(f"{served.url}/admin/reload", timeout=10)
            assert r.status_code == 200 and r.json() == {
                "reloaded": True,
                "version": version_of(v5),
            }

        _apply(served, traffic, v5, ["b"], admin)
        assert served.proc.poll() is None
    assert traffic.errors == []
    assert len(traffic.results) >= 60


def test_invalid_file_is_refused_and_old_policy_stays(tmp_path, urls) -> None:
    policy = tmp_path / "policy.yaml"
    good = policy_text(urls, ["a", "b"])
    policy.write_text(good)
    with serve(policy, tmp_path / "gw.log") as served, Traffic(served.url + "/v1", 2) as traffic:
        version = served.ready()["policy_version"]
        write_atomic(policy, good.replace("strategy: p2c_peak_ewma", "strategy: fastest"))
        poll(lambda: "policy reload refused" in served.log_text(), "the refusal in the log")
        assert "pools.main.balancer.strategy: Input should be" in served.log_text()
        r = httpx.post(f"{served.url}/admin/reload", timeout=10)
        assert r.status_code == 400
        doc = r.json()
        assert doc["reloaded"] is False and doc["version"] == version
        assert doc["errors"][0].startswith("pools.main.balancer.strategy: Input should be")
        write_atomic(policy, good.replace("members: [a, b]", "members: [a, zzz]"))
        r = httpx.post(f"{served.url}/admin/reload", timeout=10)
        assert r.status_code == 400
        assert r.json()["errors"][0].startswith("pools.main.members: unknown provider 'zzz' (line")
        write_atomic(policy, "providers: [this is not: yaml")
        r = httpx.post(f"{served.url}/admin/reload", timeout=10)
        assert r.status_code == 400 and r.json()["errors"][0].startswith(f"{policy}: invalid YAML")
        assert served.ready()["policy_version"] == version
        assert traffic.providers_after(time.monotonic()) <= {"a", "b"}
    assert traffic.errors == []


async def test_latency_estimates_survive_a_reload(urls) -> None:
    runtime = Runtime(parse_policy(policy_text(urls, ["a", "b"])))
    try:
        a = runtime.snapshot.providers["a"]
        a.member.begin()
        a.member.end(0.25)
        a.member.begin()  # one request still in flight across the reload
        before = a.member.ewma.estimate()
        remaining = {n: urls[n] for n in ("a", "c")}  # b leaves the policy
        snap = runtime.apply(parse_policy(policy_text(remaining, ["a", "c"], "round_robin")))
        kept = snap.providers["a"]
        assert kept.member is a.member and kept.breaker is a.breaker
        assert kept.member.ewma.observations == 1 and kept.member.inflight == 1
        assert kept.member.ewma.estimate() == pytest.approx(before, rel=0.01)
        assert snap.pools["main"].members == [kept.member, snap.providers["c"].member]
        assert snap.providers["c"].member.ewma.observations == 0
        assert "b" not in snap.providers
    finally:
        await runtime.aclose()


def test_reload_on_one_replica_reaches_the_other(tmp_path, urls, redis_url, redis_prefix) -> None:
    """The reload signal makes each replica re-read ITS OWN file; policy content that arrives
    through Redis is never applied."""
    env = {"REDIS_URL": redis_url, "GATEWAY_REDIS_PREFIX": redis_prefix}
    first = policy_text(urls, ["a"])
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    paths = []
    for i in (1, 2, 3):
        (hidden / f"{i}.yaml").write_text(first)
        (tmp_path / f"replica{i}").mkdir()
        link = tmp_path / f"replica{i}" / "policy.yaml"
        link.symlink_to(hidden / f"{i}.yaml")
        paths.append(link)
    channel = f"{redis_prefix}policy"
    r = redis.Redis.from_url(redis_url)
    specs = [(paths[i], tmp_path / f"r{i + 1}.log", env) for i in (0, 1, 2)]
    with serve_many(*specs) as (one, two, three):
        poll(lambda: dict(r.pubsub_numsub(channel))[channel.encode()] >= 3, "all subscribed")
        # Anyone who can write to Redis publishes a policy of their own (the old message shape
        # carried the policy text): no replica applies it.
        hostile = policy_text(urls, ["b"], "round_robin")
        r.publish(channel, orjson.dumps({"origin": "attacker", "version": "x", "text": hostile}))
        r.publish(channel, orjson.dumps({"origin": "attacker", "sha256": "0" * 64}))
        time.sleep(0.5)
        for replica in (one, two, three):
            assert replica.ready()["policy_version"] == version_of(first)
        # The operator rolls a new file out to replicas 1 and 2 only, and reloads replica 1.
        second = policy_text(urls, ["c"], "round_robin")
        write_atomic(hidden / "1.yaml", second)
        write_atomic(hidden / "2.yaml", second)
        reply = httpx.post(f"{one.url}/admin/reload", timeout=10).json()
        assert reply == {"reloaded": True, "version": version_of(second)}
        poll(lambda: two.ready()["policy_version"] == version_of(second), "replica 2")
        answer = httpx.post(
            f"{two.url}/v1/chat/completions",
            json={"model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
            timeout=10,
        )
        assert answer.headers["x-gateway-provider"] == "c"
        # Replica 3's file did not change: it stays on its own version and says why.
        poll(lambda: "does not have" in three.log_text(), "replica 3's warning")
        assert three.ready()["policy_version"] == version_of(first)
        assert (hidden / "3.yaml").read_text() == first
    r.close()
