"""Policy and rules files are read with a bound that holds for what is read, not for what a stat
said: a device (/dev/zero, /dev/urandom) or a FIFO named as a policy or rules file is refused at
once (it was read without end, or waited on for a writer, holding the reload lock for good)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.infra.shared_state import SharedState
from gateway.policy.loader import PolicyError, check_policy_file, read_policy_text
from gateway.policy.schema import Policy
from gateway.policy.source import MAX_BYTES
from gateway.policy.watcher import PolicyReloader
from tests.support import policy

GOOD = """\
version: 1
providers:
  a: {base_url: "http://127.0.0.1:9/v1"}
pools:
  main: {members: [a]}
models:
  chat: {pool: main}
"""


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "/dev/null", "fifo"])
def test_special_files_are_refused_at_once(special: str, fifo: Path) -> None:
    path = fifo if special == "fifo" else Path(special)
    t0 = time.monotonic()
    with pytest.raises(PolicyError) as e:
        read_policy_text(path)
    assert e.value.problems == [f"{path}: not a regular file"]
    report = check_policy_file(path, env={})
    assert report.policy is None and report.errors == [f"{path}: not a regular file"]
    assert time.monotonic() - t0 < 2


def test_a_file_growing_past_the_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(GOOD + "#" * (MAX_BYTES + 10) + "\n")
    report = check_policy_file(path, env={})
    assert report.policy is None
    assert report.errors == [f"{path}: refused: the file is larger than {MAX_BYTES} bytes"]


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_rules_naming_a_special_file_are_refused(tmp_path: Path, fifo: Path, special: str) -> None:
    rules = fifo if special == "fifo" else Path(special)
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD + f"degradation: {{rules: '{rules}'}}\n")
    t0 = time.monotonic()
    report = check_policy_file(path, env={})
    assert report.policy is None
    assert len(report.errors) == 1 and report.errors[0].startswith("degradation.rules: ")
    assert "not a regular file" in report.errors[0], report.errors
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_policy_check_answers_at_once(tmp_path: Path, fifo: Path, special: str) -> None:
    path = fifo if special == "fifo" else Path(special)
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1
    assert res.stderr.strip() == f"{path}: error: {path}: not a regular file"


async def test_a_reload_onto_a_fifo_is_refused_and_the_next_one_works(
    tmp_path: Path, fifo: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    applied: list[Policy] = []

    def apply(p: Policy) -> str:
        applied.append(p)
        return f"v{len(applied)}"

    state = SharedState(None)
    reloader = PolicyReloader(str(path), apply, state, "test")
    try:
        assert await reloader.reload(publish=False) == "v1"
        path.unlink()
        path.symlink_to(fifo)
        t0 = time.monotonic()
        assert await reloader.reload(publish=False) is None
        assert time.monotonic() - t0 < 2
        assert reloader.last_error == [f"{path}: not a regular file"]
        path.unlink()
        path.write_text(GOOD.replace("chat:", "chat2:"))
        assert await reloader.reload(publish=False) == "v2"  # the lock was not held
        assert list(applied[-1].models) == ["chat2"]
    finally:
        await state.aclose()


def test_a_live_gateway_keeps_serving(fleet, gateway, fifo: Path) -> None:
    gw = gateway(policy(fleet, "a"))
    version = gw.runtime.snapshot.version
    gw.policy_path.unlink()
    gw.policy_path.symlink_to("/dev/zero")
    r = httpx.post(gw.url + "/admin/reload", timeout=15)
    assert r.status_code == 400 and "not a regular file" in r.text, r.text
    assert gw.runtime.snapshot.version == version
    assert gw.chat().status_code == 200
