"""Optional max-throughput measurement with ``wrk`` (C, far cheaper than any Python generator).

Each request gets a distinct prompt (a counter spliced into the body by a Lua script) so a cache in
front of the target cannot answer the whole run. wrk is closed-loop: use its req/s, not its tails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

NONCE = "__NONCE__"
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}

_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
{auth}
local head = [==[{head}]==]
local tail = [==[{tail}]==]
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, head .. n .. tail)
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def lua_script(body: str, api_key: str | None) -> str:
    """A wrk script posting ``body`` with ``NONCE`` replaced by a per-request counter."""
    head, _, tail = body.partition(NONCE)
    auth = f'wrk.headers["Authorization"] = "Bearer {api_key}"' if api_key else ""
    return _LUA.format(auth=auth, head=head, tail=tail)


def parse_output(text: str) -> dict[str, float]:
    """Requests/sec, latency percentiles (ms) and error counts from ``wrk --latency`` output."""
    out: dict[str, float] = {}
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    out["req_per_s"] = float(m.group(1)) if m else float("nan")
    for q, value, unit in re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
        out[f"lat_p{q}_ms"] = float(value) * _UNITS[unit]
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    out["non_2xx"] = float(m.group(1)) if m else 0.0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["socket_errors"] = float(sum(int(g) for g in m.groups())) if m else 0.0
    m = re.search(r"(\d+) requests in", text)
    out["requests"] = float(m.group(1)) if m else 0.0
    return out


def run(
    endpoint: str,
    body: str,
    api_key: str | None,
    connections: int,
    duration_s: float,
    threads: int = 1,
) -> dict[str, float]:
    """Run wrk for ``duration_s`` (whole seconds, at least 1) and parse its report."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(lua_script(body, api_key))
        seconds = max(int(round(duration_s)), 1)
        cmd = [
            "wrk",
            f"-t{threads}",
            f"-c{max(connections, threads)}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            endpoint,
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=seconds + 30, check=False
        )
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed: {proc.stderr.strip()[:300]}")
    return parse_output(proc.stdout)
