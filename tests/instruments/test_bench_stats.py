"""Statistics, schedules and small parsers of the benchmark tool, checked against numpy."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest

from loadtests.bench import wrk
from loadtests.bench.client import check_url, parse_target
from loadtests.bench.procstat import read_proc
from loadtests.bench.prompts import TokenDist, make_prompt
from loadtests.bench.schedule import constant_times, poisson_times, send_times
from loadtests.bench.stats import (
    histogram,
    log_edges,
    mean_std,
    percentile_sorted,
    percentiles,
    summarize,
    window_index,
)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentiles_match_numpy_linear(n: int) -> None:
    rng = random.Random(n)
    values = [rng.lognormvariate(0, 1) for _ in range(n)]
    qs = [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 100.0]
    assert percentiles(values, qs) == pytest.approx(np.percentile(values, qs).tolist(), rel=1e-12)


def test_percentile_known_values_and_edges() -> None:
    assert percentile_sorted([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile_sorted([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert math.isnan(percentile_sorted([], 50))
    with pytest.raises(ValueError):
        percentile_sorted([1.0], 101)


def test_mean_std_and_summary_match_numpy() -> None:
    values = [random.Random(1).gauss(10, 3) for _ in range(500)]
    mean, std = mean_std(values)
    assert mean == pytest.approx(np.mean(values))
    assert std == pytest.approx(np.std(values))  # population std, ddof=0
    s = summarize(values)
    assert (s.count, s.min, s.max) == (500, min(values), max(values))
    assert s.p99 == pytest.approx(np.percentile(values, 99))
    assert summarize([]).count == 0 and math.isnan(summarize([]).p50)


def test_histogram_matches_numpy_and_clamps() -> None:
    values = [random.Random(2).uniform(0.001, 1.0) for _ in range(1000)]
    edges = log_edges(0.001, 1.0, 12)
    assert histogram(values, edges) == np.histogram(values, bins=edges)[0].tolist()
    assert histogram([0.0, 5.0], edges) == [1] + [0] * 10 + [1]


def test_windows_group_by_width() -> None:
    assert window_index([0.1, 0.9, 1.0, 2.5], 1.0) == {0: [0, 1], 1: [2], 2: [3]}


def test_poisson_schedule_statistics_and_seed() -> None:
    times = poisson_times(200.0, count=20_000, seed=7)
    gaps = np.diff(times)
    assert len(times) == 20_000 and times[0] == 0.0
    assert gaps.mean() == pytest.approx(1 / 200, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV = 1
    assert poisson_times(200.0, count=100, seed=7) == times[:100]
    assert poisson_times(200.0, count=100, seed=8) != times[:100]


def test_schedules_are_bounded() -> None:
    assert constant_times(10, duration=1.0) == pytest.approx([i / 10 for i in range(10)])
    assert len(constant_times(10, duration=100, count=5)) == 5
    assert max(poisson_times(50, duration=2.0, seed=1)) < 2.0
    assert send_times("constant", 4, count=3) == [0.0, 0.25, 0.5]
    with pytest.raises(ValueError):
        constant_times(10)
    with pytest.raises(ValueError):
        send_times("bursty", 10, 1.0)  # type: ignore[arg-type]


def test_token_specs_and_prompt_length() -> None:
    rng = random.Random(0)
    assert TokenDist.parse("100").sample(rng) == 100
    assert all(50 <= TokenDist.parse("50-60").sample(rng) <= 60 for _ in range(50))
    assert {TokenDist.parse("1,5").sample(rng) for _ in range(50)} == {1, 5}
    assert len(make_prompt(100, rng).split()) == 98  # nonce + 97 one-token words ~ 100 tokens
    with pytest.raises(ValueError):
        TokenDist.parse("9-3")


def test_url_guard_and_target_names() -> None:
    check_url("http://127.0.0.1:8080/v1", allow_remote=False)
    check_url("http://localhost:1/v1", allow_remote=False)
    check_url("http://[::1]:1/v1", allow_remote=False)
    with pytest.raises(ValueError):
        check_url("http://10.1.2.3/v1", allow_remote=False)
    check_url("https://api.example.com/v1", allow_remote=True)
    assert parse_target("gw=http://127.0.0.1:1/v1", "m", None).name == "gw"
    assert parse_target("http://127.0.0.1:1/v1", "m", None, 2).name == "t2"


def test_read_proc_of_self() -> None:
    sample = read_proc(os.getpid())
    assert sample.cpu_s > 0 and sample.rss_bytes > 10 * 2**20


WRK_OUTPUT = """Running 1s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 4 connections
  Latency Distribution
     50%  210.00us
     75%  300.00us
     90%    1.20ms
     99%    1.50s
  12345 requests in 1.00s, 3.00MB read
  Non-2xx or 3xx responses: 7
Requests/sec:  12345.67
"""


def test_wrk_output_parsing_and_script() -> None:
    out = wrk.parse_output(WRK_OUTPUT)
    assert out["req_per_s"] == 12345.67 and out["requests"] == 12345 and out["non_2xx"] == 7
    assert out["lat_p50_ms"] == pytest.approx(0.21) and out["lat_p99_ms"] == 1500.0
    script = wrk.lua_script('{"a": "__NONCE__ x"}', "k")
    assert '[==[{"a": "]==]' in script and "Bearer k" in script


def test_soak_drift_is_robust_to_one_slow_window() -> None:
    from types import SimpleNamespace

    from loadtests.bench.modes import _drift

    rows = [
        {"t_s": 10.0 * i, "lat_p50_ms": 1.0, "lat_p99_ms": 5.0, "req_per_s": 100.0, "errors": 0}
        for i in range(100)
    ]
    rows[-1]["lat_p99_ms"] = 60.0  # one pause in the last window
    rss = [100, 110, 120, 120, 120, 120, 120, 120, 120, 120, 120]  # fills, then flat
    points = [
        SimpleNamespace(t=100.0 * i, rss_bytes=mb * 2**20, cpu_s=0.0) for i, mb in enumerate(rss)
    ]
    sampler = SimpleNamespace(series={"gateway": points})
    drift = {d["metric"]: d for d in _drift(rows, sampler, 1000.0, 10.0)}  # type: ignore[arg-type]
    assert drift["lat_p99_ms"]["ratio"] == 1.0 and drift["lat_p99_ms"]["windows"] == 10
    assert drift["gateway_rss_mb"]["ratio"] == 1.2
    assert drift["gateway_rss_mb"]["ratio_after_warmup"] == pytest.approx(120 / 110)
