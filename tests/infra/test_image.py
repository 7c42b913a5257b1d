"""The image and the install use the locked dependencies; the image runs as non-root with a
HEALTHCHECK (no Docker daemon here: the Dockerfile and the lock are checked as files)."""

from __future__ import annotations

import re
import tomllib

from tests.support import ROOT

LOCK = ROOT / "requirements.lock"


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def locked() -> dict[str, str]:
    """name -> version of every pinned package; each pin must carry hashes."""
    text = LOCK.read_text()
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^\s\\]+)", block)
        if m:
            assert "--hash=sha256:" in block, f"{m.group(1)} is pinned without a hash"
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_lock_pins_every_dependency_of_the_image() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["otlp"]
    pins = locked()
    missing = [r for r in wanted if _name(r) not in pins]
    assert not missing, f"not in requirements.lock (regenerate it, see the Dockerfile): {missing}"
    # uvicorn[standard]'s fast parts are locked too.
    assert {"uvloop", "httptools"} <= pins.keys()


def test_dockerfile_is_locked_small_non_root_and_checked() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert len(stages) == 2 and stages[0][1] == "build" and stages[1][1] == ""
    assert all("-slim" in image for image, _ in stages)
    build, final = text.split("\nFROM ", 2)[1:]
    assert "pip install --require-hashes -r requirements.lock" in build
    assert "COPY --from=build /opt/venv /opt/venv" in final
    assert "pip install" not in final  # nothing resolved in the final stage
    user = re.findall(r"^USER\s+(\S+)", final, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    assert re.search(r"^HEALTHCHECK .*CMD", final, re.M | re.S) and "/health" in final
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignore)


def test_readme_install_uses_the_lock() -> None:
    serve = (ROOT / "scripts" / "serve.sh").read_text()
    assert "--require-hashes -r requirements.lock" in serve
    assert "--no-deps -e ." in serve
