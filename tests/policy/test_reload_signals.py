"""Reload signals arrive through Redis, where anyone able to write can publish: only a message of
the shape replicas publish (a printable origin, a SHA-256 in hex) makes a replica re-read its own
file; an origin holding a line break can no longer forge log lines, and a flood of signals naming
a file the replica does not have logs one warning per 10 s, not one per message."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import orjson
import pytest
import redis

from gateway.infra.shared_state import SharedState
from gateway.policy.loader import text_hash
from gateway.policy.schema import Policy
from gateway.policy.watcher import CHANNEL, PolicyReloader

POLICY = """\
providers:
  a: {{base_url: "http://127.0.0.1:9/v1"}}
pools:
  main: {{members: [a]}}
models:
  {alias}: {{pool: main}}
"""

MALFORMED = [
    {"origin": "attacker\n2026-01-01 ERROR gateway: forged line", "sha256": "0" * 64},
    {"origin": "attacker", "sha256": "0" * 63},
    {"origin": "attacker", "sha256": "Z" * 64},
    {"origin": "attacker", "sha256": "0" * 64 + "\n"},
    {"origin": "attacker"},
    {"origin": "", "sha256": "0" * 64},
    {"origin": "x" * 201, "sha256": "0" * 64},
    {"origin": ["a"], "sha256": "0" * 64},
    {"origin": "attacker", "sha256": 7},
    {"origin": "attacker", "version": "x", "text": "providers: {}"},
]


@pytest.fixture
async def replica(tmp_path: Path, redis_url: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(alias="one"))
    applied: list[Policy] = []

    def apply(p: Policy) -> str:
        applied.append(p)
        return f"v{len(applied)}"

    state = SharedState(redis_url, prefix=f"gwsig:{uuid.uuid4().hex[:8]}:")
    reloader = PolicyReloader(str(path), apply, state, "replica-1")
    await reloader.reload(publish=False)
    reloader.start()
    assert reloader._sub is not None and await reloader._sub.wait_live()
    raw = redis.Redis.from_url(redis_url)
    try:
        yield reloader, applied, path, raw, state.key(CHANNEL)
    finally:
        raw.close()
        await reloader.stop()
        await state.aclose()


async def settle(reloader: PolicyReloader, count: int) -> None:
    deadline = time.monotonic() + 5
    while reloader._sub is not None and reloader._sub.received < count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # the handlers' work (file reads) done


async def test_malformed_signals_are_dropped_unread(replica, caplog) -> None:
    reloader, applied, path, raw, channel = replica
    # The file changed on disk, unseen so far (the watch is slower than this test's signals):
    # any signal that counted would reload it.
    reloader._watch and await reloader._watch.stop()
    path.write_text(POLICY.format(alias="two"))
    caplog.set_level(logging.INFO, logger="gateway.policy")
    for msg in MALFORMED:
        raw.publish(channel, orjson.dumps(msg))
    raw.publish(channel, b"\xff\xfe not json")
    await settle(reloader, len(MALFORMED) + 1)
    assert len(applied) == 1
    assert reloader.ignored_signals == len(MALFORMED)
    assert "forged" not in caplog.text
    # A signal of the right shape makes the replica re-read its own file.
    raw.publish(
        channel, orjson.dumps({"origin": "replica-2", "sha256": text_hash(path.read_text())})
    )
    await settle(reloader, len(MALFORMED) + 2)
    assert len(applied) == 2 and list(applied[-1].models) == ["two"]
    # Its own signal is not.
    path.write_text(POLICY.format(alias="three"))
    raw.publish(channel, orjson.dumps({"origin": "replica-1", "sha256": "1" * 64}))
    await settle(reloader, len(MALFORMED) + 3)
    assert len(applied) == 2


async def test_a_flood_of_foreign_hashes_logs_once(replica, caplog) -> None:
    reloader, applied, _path, raw, channel = replica
    caplog.set_level(logging.WARNING, logger="gateway.policy")
    for i in range(200):
        raw.publish(channel, orjson.dumps({"origin": f"r{i}", "sha256": f"{i:064x}"}))
    await settle(reloader, 200)
    warnings = [r for r in caplog.records if "does not have" in r.getMessage()]
    assert len(warnings) == 1, len(warnings)
    assert len(applied) == 1  # the own file did not change: nothing reloaded
