"""Degradation rules under a Kubernetes ConfigMap volume: every update swaps the `..data`
symlink to a new timestamped folder; the rules in force follow each swap, whatever part of the
path is a symlink (the folder mounted itself, a folder inside a projected volume, or one file)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.resilience.degrade_rules import RuleStore


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.02)


def _version(mount: Path, n: int, inner: str) -> None:
    """A new timestamped folder with the rules of version `n`, then the atomic `..data` swap."""
    folder = mount / f"..v{n}" / inner if inner else mount / f"..v{n}"
    folder.mkdir(parents=True)
    (folder / "default.yaml").write_text(f"default: {{template: 'v{n}'}}\n")
    os.symlink(f"..v{n}", mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")


def _layout(tmp_path: Path, kind: str) -> Path:
    """The rules path the policy would name, with version 1 in place."""
    mount = tmp_path / "mount"
    mount.mkdir()
    if kind == "folder":  # the ConfigMap mounted as the rules folder itself
        _version(mount, 1, "")
        os.symlink("..data/default.yaml", mount / "default.yaml")
        return mount
    if kind == "projected":  # one volume, the rules a folder inside it: fallbacks -> ..data/...
        _version(mount, 1, "fallbacks")
        os.symlink("..data/fallbacks", mount / "fallbacks")
        return mount / "fallbacks"
    _version(mount, 1, "")  # one rules file
    os.symlink("..data/default.yaml", mount / "default.yaml")
    return mount / "default.yaml"


@pytest.mark.parametrize("kind", ["folder", "projected", "file"])
async def test_rules_follow_every_configmap_swap(tmp_path: Path, kind: str) -> None:
    path = _layout(tmp_path, kind)
    mount = tmp_path / "mount"
    inner = "fallbacks" if kind == "projected" else ""
    store = RuleStore(path, debounce_ms=50)
    await store.start()
    try:
        assert store.match("m", "c", "t", "x").template == "v1"
        await asyncio.sleep(0.3)  # the watch is ready
        for n in (2, 3, 4):
            _version(mount, n, inner)
            old = mount / f"..v{n - 1}"
            for p in sorted(old.rglob("*"), reverse=True):  # the old folder goes, as kubelet does
                p.rmdir() if p.is_dir() else p.unlink()
            old.rmdir()
            await until(lambda n=n: store.match("m", "c", "t", "x").template == f"v{n}")
    finally:
        await store.stop()
