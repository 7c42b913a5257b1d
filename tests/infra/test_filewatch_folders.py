"""The policy's folder itself replaced: a release symlink (`current -> release-1`) pointed at a new
release, or the folder deleted and made again. The watch stayed on the old folder and never saw
another change (only SIGHUP or the admin call reloaded); the path is now compared every second
too, so the running gateway reloads the new file within seconds, and a bad one is refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gateway.infra.shared_state import SharedState
from gateway.policy.schema import Policy
from gateway.policy.watcher import PolicyReloader
from tests.support import free_port, wait_http

POLICY = """\
providers:
  a: {{base_url: "{url}"}}
pools:
  main: {{members: [a]}}
models:
  {alias}: {{pool: main}}
"""


def release(base: Path, name: str, url: str, alias: str) -> Path:
    folder = base / name
    folder.mkdir()
    (folder / "policy.yaml").write_text(POLICY.format(url=url, alias=alias))
    return folder


def point(link: Path, target: Path) -> None:
    """Swap a symlink atomically, as release tools do."""
    tmp = link.with_name(link.name + ".tmp")
    tmp.symlink_to(target)
    os.rename(tmp, link)


async def until(condition, within_s: float = 6.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)


async def test_a_swapped_release_folder_and_a_remade_folder_reload(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/v1"
    current = tmp_path / "current"
    current.symlink_to(release(tmp_path, "release-1", url, "one"))
    applied: list[Policy] = []

    def apply(p: Policy) -> str:
        applied.append(p)
        return f"v{len(applied)}"

    state = SharedState(None)
    reloader = PolicyReloader(str(current / "policy.yaml"), apply, state, "test")
    await reloader.reload(publish=False)
    reloader.start()
    try:
        await asyncio.sleep(0.3)
        point(current, release(tmp_path, "release-2", url, "two"))
        await until(lambda: list(applied[-1].models) == ["two"])
        # Later edits inside the new release are seen too.
        (tmp_path / "release-2" / "policy.yaml").write_text(POLICY.format(url=url, alias="three"))
        await until(lambda: list(applied[-1].models) == ["three"])
        # A broken release is refused and the running policy stays.
        bad = release(tmp_path, "release-3", url, "four")
        (bad / "policy.yaml").write_text("providers: [")
        point(current, bad)
        await until(lambda: reloader.failures >= 1)
        assert list(applied[-1].models) == ["three"]
        # The folder deleted and made again (a directory replaced by a deploy tool).
        n = len(applied)
        point(current, tmp_path / "release-2")
        await until(lambda: len(applied) > n)
        shutil.rmtree(tmp_path / "release-2")
        await asyncio.sleep(0.5)
        release(tmp_path, "release-2", url, "five")
        await until(lambda: list(applied[-1].models) == ["five"])
    finally:
        await reloader.stop()
        await state.aclose()


def test_a_running_gateway_follows_its_release_symlink(tmp_path: Path, fleet) -> None:
    current = tmp_path / "current"
    current.symlink_to(release(tmp_path, "release-1", fleet.url("a"), "one"))
    port = free_port()
    log = (tmp_path / "log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
        + ["--policy", str(current / "policy.yaml"), "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", proc)
        body = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{base}/v1/chat/completions", json={"model": "one", **body}).is_success
        point(current, release(tmp_path, "release-2", fleet.url("a"), "two"))
        deadline = time.monotonic() + 8
        while True:
            r = httpx.post(f"{base}/v1/chat/completions", json={"model": "two", **body})
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
