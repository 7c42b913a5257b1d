"""REDIS_URL is checked before the gateway listens: a URL no client can use (a port that is not
a number, an unknown scheme, a Sentinel URL without its service, a database that is not a
number, a bad query option) is one clear line naming REDIS_URL and exit 2, never a traceback
from each worker nor a silent fallback to database 0; its password is never printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.infra.redis_client import make_redis, url_problem

SECRET = "s3cret-pw"

BAD = [
    f"redis://:{SECRET}@127.0.0.1:abc/0",
    f"redis://:{SECRET}@127.0.0.1:99999/0",
    "redis://127.0.0.1:0/0",
    "redis://127.0.0.1:6379/x",  # redis-py reads it as database 0
    "redis://127.0.0.1:6379/0/1",
    "redis://127.0.0.1:6379/0?socket_timeout=soon",
    "redis://a:6379,b:6379/0",  # several hosts: a cluster or Sentinels
    f"http://:{SECRET}@127.0.0.1:6379/0",
    "127.0.0.1:6379",
    f"redis+cluster://:{SECRET}@127.0.0.1:abc,127.0.0.1:7001",
    "redis+cluster://",
    f"redis+sentinel://:{SECRET}@127.0.0.1:26379",
    "redis+sentinel://127.0.0.1:26379/mymaster/x",
    "redis+sentinel://127.0.0.1:70000/mymaster",
    "redis://127.0.0.1:6379/0\n",
    "unix://",
]

GOOD = [
    "redis://127.0.0.1:6379/0",
    "redis://localhost",
    "redis:///0",
    f"rediss://user:{SECRET}@cache.internal:6380/2",
    "redis://[::1]:6379/0",
    "redis://127.0.0.1:6379/0?socket_timeout=2",
    "unix:///run/redis/redis.sock",
    f"redis+cluster://:{SECRET}@redis-0.redis:6379,redis-1.redis:6379/0",
    "rediss+cluster://127.0.0.1:7000",
    "redis+sentinel://s1:26379,s2:26379/mymaster/0",
    "rediss+sentinel://s1/mymaster",
]


@pytest.mark.parametrize("url", BAD)
def test_unusable_urls_are_named_without_their_password(url: str) -> None:
    problem = url_problem(url)
    assert problem, url
    assert SECRET not in problem
    assert problem.isprintable()


@pytest.mark.parametrize("url", GOOD)
def test_usable_urls_pass_and_make_a_client(url: str) -> None:
    assert url_problem(url) is None
    assert make_redis(url) is not None


def _run(args: list[str], url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "p.yaml"
    path.write_text(
        'providers:\n  a: {base_url: "http://127.0.0.1:9/v1"}\n'
        "pools:\n  main: {members: [a]}\nmodels:\n  chat: {pool: main}\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, str(path)],
        env={**os.environ, "REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("url", [BAD[0], BAD[3], BAD[11]])
def test_serve_refuses_to_start_on_it(url: str, tmp_path: Path) -> None:
    res = _run(["serve", "--port", "24041", "--policy"], url, tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"REDIS_URL: {url_problem(url)}" in res.stderr
    assert "Traceback" not in res.stderr
    assert SECRET not in res.stderr + res.stdout


def test_policy_check_reports_it(tmp_path: Path) -> None:
    res = _run(["policy", "check"], BAD[0], tmp_path)
    assert res.returncode == 1
    assert "error: REDIS_URL: a port is not a number" in res.stderr
    assert SECRET not in res.stderr + res.stdout
    ok = _run(["policy", "check"], GOOD[0], tmp_path)
    assert ok.returncode == 0, ok.stderr
