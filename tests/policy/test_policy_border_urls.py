"""A provider's base_url that no request could reach is refused before traffic, with its field
path and line (at start, by `gateway policy check` and by a reload, which keeps the running
policy), whether written in the file or brought in by a `${VAR}`; and no value quoted in a problem
can break the report into lines of its own."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from gateway.policy.loader import check_policy
from tests.support import environment, policy

TEMPLATE = """\
version: 1
providers:
  ok: {base_url: "http://127.0.0.1:9/v1"}
  up:
    base_url: "${UP_URL}"
pools:
  main: {members: [ok, up]}
models:
  chat: {pool: main}
"""

UNREACHABLE = [
    "http://127.0.0.1:9/v1\nX-Injected: 1",  # a line break (an interpolated header, YAML...)
    "http://127.0.0.1:9/v1\r",
    "http://127.0.0.1:9/v1\x00",
    "http://127.0.0.1:9/v1\x7f",
    "http://127.0.0.1:9/v 1",
    "http://llm host:8000/v1",
    "http://127.0.0.1:99999/v1",  # beyond 65535
    "http://127.0.0.1:0/v1",
    "http://127.0.0.1:80a/v1",
    "http://127.0.0.1:-1/v1",
    "http://127.0.0.1:9/v1#section",  # paths appended after a fragment are never sent
    "http://[::1/v1",
]

REACHABLE = [
    "http://127.0.0.1:9/v1",
    "https://api.example.com/v1/",
    "http://[::1]:8000/v1",
    "http://[::1]/v1",
    "http://llm-host.svc.cluster.local:65535/v1",
    "http://127.0.0.1:9/ok/v1?api-version=2024-10-21",
]


@pytest.mark.parametrize("url", UNREACHABLE)
@pytest.mark.parametrize("how", ["file", "variable"])
def test_an_unreachable_base_url_is_refused_with_path_and_line(url: str, how: str) -> None:
    if how == "file":
        quoted = url.encode("unicode_escape").decode().replace('"', '\\"')
        text, env = TEMPLATE.replace("${UP_URL}", quoted), {}
    else:
        text, env = TEMPLATE, {"UP_URL": url}
    report = check_policy(text, "p.yaml", env)
    assert report.policy is None
    assert len(report.errors) == 1, report.errors
    assert report.errors[0].startswith("providers.up.base_url: "), report.errors
    assert report.errors[0].endswith("(line 5)"), report.errors
    assert "\n" not in report.errors[0] and "\r" not in report.errors[0]


@pytest.mark.parametrize("url", REACHABLE)
def test_usable_base_urls_still_pass(url: str) -> None:
    report = check_policy(TEMPLATE, "p.yaml", {"UP_URL": url})
    assert report.errors == []
    assert report.policy is not None
    assert report.policy.providers["up"].base_url == url


@pytest.mark.parametrize(
    "text, env",
    [
        # A variable with a line break in a name that other fields refer to.
        (TEMPLATE.replace("{pool: main}", '{pool: "${POOL}"}'), {"POOL": "main\n  chat: ok"}),
        # A key holding a line break, and one quoted in a duplicate-key report.
        (TEMPLATE.replace("  chat:", '  "chat\\nfake.yaml: ok":'), {}),
        (TEMPLATE + 'models:\n  "a\\u2028b": {pool: nowhere}\n', {"UP_URL": "http://h/v1"}),
    ],
)
def test_every_problem_is_one_line(text: str, env: dict[str, str]) -> None:
    env = {"UP_URL": "http://127.0.0.1:9/v1", **env}
    report = check_policy(text, "p.yaml", env)
    assert report.errors
    for problem in report.errors + report.warnings:
        assert problem.isprintable(), problem


def test_policy_check_refuses_it_and_prints_one_line_per_problem(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(TEMPLATE.replace("{pool: main}", '{pool: "${POOL}"}'))
    with environment(UP_URL="http://127.0.0.1:99999/v1", POOL="main\np.yaml: ok (forged)"):
        res = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "policy", "check", str(path)],
            capture_output=True,
            text=True,
        )
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert any("providers.up.base_url: the port" in line for line in lines), res.stderr
    assert all(line.startswith(f"{path}: ") for line in lines), res.stderr
    assert not any("forged" in line and "error" not in line for line in lines), res.stderr
    assert res.stdout == ""


def test_serve_refuses_to_start_on_it(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(TEMPLATE)
    with environment(UP_URL="http://127.0.0.1:9/v1\nHost: elsewhere"):
        res = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", "24011"]
            + ["--policy", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 2, res.stderr
    assert "providers.up.base_url: holds a space or control character" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_reload_to_it_under_traffic_keeps_the_running_policy(fleet, gateway) -> None:
    good = policy(fleet, "a")
    gw = gateway(good)
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=gw.base_url, timeout=15) as client:
            while not stop.is_set():
                r = client.post(
                    "/chat/completions",
                    json={
                        "model": "chat",
                        "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                )
                statuses.append(r.status_code)

    version = gw.runtime.snapshot.version
    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for bad in ("http://127.0.0.1:65536/v1", "http://127.0.0.1:9/v1#x"):
            gw.policy_path.write_text(good.replace(fleet.url("a"), bad))
            r = httpx.post(gw.url + "/admin/reload", timeout=15)
            assert r.status_code >= 400, r.text
            assert "providers.a.base_url" in r.text, r.text
            assert gw.runtime.snapshot.version == version
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert statuses and set(statuses) == {200}, statuses
