"""The code stays formatted (ruff), lint-clean (ruff) and type-checked (mypy, `gateway/`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ["gateway", "tests", "loadtests"]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_fix_or_reformat() -> None:
    pytest.importorskip("ruff", reason="ruff is not installed (the dev extra)")
    check = _run(sys.executable, "-m", "ruff", "check", *TREES)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run(sys.executable, "-m", "ruff", "format", "--check", *TREES)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_the_gateway_type_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (the dev extra)")
    result = _run(sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "gateway")
    assert result.returncode == 0, result.stdout + result.stderr
