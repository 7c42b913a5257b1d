"""Every benchmark mode end to end, through the command line, against a real loopback server.

Each run is tiny (well under a second of load); each writes JSON, markdown and PNGs that must parse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadtests.bench import wrk
from loadtests.bench.cli import app
from loadtests.bench.echo_server import EchoServerThread

runner = CliRunner()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[EchoServerThread, EchoServerThread]]:
    # The second one adds 1 ms per request and streams a token per ms: a stand-in "gateway".
    a, b = EchoServerThread().start(), EchoServerThread(0.001, 0.0005).start()
    yield a, b
    a.stop()
    b.stop()


def _run(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "--quiet", "--out", str(out), "--raw"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    data = json.loads((out / "result.json").read_text())
    assert (out / "summary.md").read_text().startswith(f"# Benchmark: {data['mode']}")
    pngs = list(out.glob("*.png"))
    assert pngs and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert all("latency" in json.loads(line) for line in lines)
    return data


def _url(server: EchoServerThread) -> list[str]:
    return ["--url", server.url, "--max-tokens", "8", "--prompt-tokens", "20-40"]


def test_baseline_streaming_reports_ttft(servers, tmp_path: Path) -> None:
    data = _run(tmp_path, "baseline", *_url(servers[1]), "--repeats", "5", "--stream")
    row = data["tables"]["baseline"][0]
    assert row["ok"] == 5 and row["errors"] == 0
    assert 0 < row["ttft_p50_ms"] <= row["lat_p50_ms"]
    assert row["out_tok_per_s"] > 0


def test_stepped(servers, tmp_path: Path) -> None:
    data = _run(tmp_path, "stepped", *_url(servers[0]), "--steps", "1,4", "--step-seconds", "0.3")
    steps = data["tables"]["steps"]
    assert [s["concurrency"] for s in steps] == [1, 4]
    assert all(s["req_per_s"] > 10 and s["errors"] == 0 for s in steps)
    assert (tmp_path / "out" / "throughput_vs_concurrency.png").exists()


def test_openloop(servers, tmp_path: Path) -> None:
    data = _run(
        tmp_path,
        "openloop",
        *_url(servers[0]),
        "--rate",
        "100",
        "--duration",
        "0.5",
        "--arrival",
        "constant",
    )
    row = data["tables"]["openloop"][0]
    assert row["requests"] == 50 and row["errors"] == 0
    assert row["scheduled_rate"] == pytest.approx(100)
    assert data["tables"]["timeline"]


def test_soak_samples_processes(servers, tmp_path: Path) -> None:
    data = _run(
        tmp_path,
        "soak",
        *_url(servers[0]),
        "--rate",
        "100",
        "--duration",
        "1",
        "--window",
        "0.25",
        "--arrival",
        "constant",
        "--pid",
        f"server={os.getpid()}",
        "--sample-interval",
        "0.05",
    )
    windows = data["tables"]["windows"]
    assert len(windows) >= 4 and "server_rss_mb" in windows[0]
    drift = {d["metric"]: d for d in data["tables"]["drift"]}
    assert "lat_p50_ms" in drift and "server_rss_mb" in drift and "generator_rss_mb" in drift
    assert data["tables"]["overall"][0]["requests"] == 100


def test_coldstart(servers, tmp_path: Path) -> None:
    data = _run(
        tmp_path, "coldstart", *_url(servers[0]), "--idle", "0.1", "--rounds", "2", "--warm", "2"
    )
    assert len(data["tables"]["rounds"]) == 2
    assert {r["kind"] for r in data["tables"]["summary"]} == {"cold", "warm"}


def test_replay_keeps_timing(servers, tmp_path: Path) -> None:
    traffic = tmp_path / "traffic.jsonl"
    lines = [
        {"offset": 0.1 * i, "prompt_tokens": 20, "max_tokens": 4, "stream": i % 2 == 0}
        for i in range(5)
    ]
    lines.append({"offset": 0.45, "messages": [{"role": "user", "content": "hi"}]})
    traffic.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    data = _run(tmp_path, "replay", *_url(servers[0]), "--file", str(traffic), "--speed", "2")
    row = data["tables"]["replay"][0]
    assert row["requests"] == 6 and row["errors"] == 0
    assert row["scheduled_rate"] == pytest.approx(5 / 0.225)  # 6 sends over 0.45 s / 2


def test_compare_gives_ratios(servers, tmp_path: Path) -> None:
    # 20 ms extra per request: a difference no load on the machine can hide.
    a, b = servers[0], EchoServerThread(0.02).start()
    data = _run(
        tmp_path,
        "compare",
        "--url",
        f"fast={a.url}",
        "--url",
        f"slow={b.url}",
        "--rounds",
        "2",
        "--per-round",
        "4",
    )
    b.stop()
    rows = {r["target"]: r for r in data["tables"]["compare"]}
    assert rows["fast"]["lat_p50_ms_ratio"] == 1.0
    assert rows["slow"]["lat_p50_ms_ratio"] > 1.0 and rows["slow"]["requests"] == 8


@pytest.mark.parametrize("use_wrk", [False, True])
def test_overhead(servers, tmp_path: Path, use_wrk: bool) -> None:
    if use_wrk and not wrk.available():
        pytest.skip("wrk not installed")
    a, b = servers
    args = [
        "overhead",
        "--direct",
        a.url,
        "--gateway",
        b.url,
        "--rounds",
        "2",
        "--one-client-requests",
        "10",
        "--rates",
        "50",
        "--rate-seconds",
        "0.4",
        "--concurrency",
        "2" if use_wrk else "1,4",
        "--step-seconds",
        "1" if use_wrk else "0.3",
        "--pid",
        f"proc={os.getpid()}",
        "--wrk" if use_wrk else "--no-wrk",
    ]
    data = _run(tmp_path, *args)
    one = {r["target"]: r for r in data["tables"]["one_client"]}
    assert one["direct"]["requests"] == 10 and one["gateway"]["added_lat_p50_ms"] > 0.5
    assert {r["target"] for r in data["tables"]["rates"]} == {"direct", "gateway"}
    best = {r["target"]: r for r in data["tables"]["max_throughput"]}
    assert best["direct"]["max_req_per_s"] > 0
    procs = {(r["process"], r["phase"]) for r in data["tables"]["process"]}
    assert ("proc", "one_client") in procs and ("generator", "rate=50") in procs


def test_calibrate(tmp_path: Path) -> None:
    data = _run(tmp_path, "calibrate", "--seconds", "0.3", "--steps", "4", "--rates", "100")
    assert data["tables"]["closed_loop"][0]["req_per_s"] > 100
    assert data["tables"]["open_loop"][0]["errors"] == 0


def test_remote_url_is_refused() -> None:
    result = runner.invoke(app, ["baseline", "--url", "http://10.9.8.7:80/v1", "--quiet"])
    assert result.exit_code != 0
    assert "allow-remote" in result.output
