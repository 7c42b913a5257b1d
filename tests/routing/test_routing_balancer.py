"""Balancer strategies, checked on a deterministic discrete-event simulation."""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from gateway.routing import (
    BalancerSettings,
    LeastBusy,
    Member,
    P2CPeakEwma,
    RoundRobin,
    SmoothWeighted,
    make_balancer,
)
from gateway.routing.balancer import Balancer
from tests.support import FakeClock


@dataclass
class Backend:
    """How a simulated member answers: latency (s) and whether it succeeds."""

    latency: float
    ok: bool = True


@dataclass
class Sim:
    """Poisson arrivals; each request is placed by the balancer and completes later."""

    balancer: Balancer
    rate: float = 20.0
    seed: int = 1
    settings: BalancerSettings = field(default_factory=BalancerSettings)
    clock: FakeClock = field(default_factory=FakeClock)
    members: list[Member] = field(default_factory=list)
    backends: dict[str, Backend] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    unmeasured_peak: Counter[str] = field(default_factory=Counter)
    peak: Counter[str] = field(default_factory=Counter)
    _done: list[tuple[float, int, Member]] = field(default_factory=list)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def add(self, name: str, backend: Backend, max_inflight: int | None = None) -> Member:
        m = self.settings.make_member(name, max_inflight=max_inflight, clock=self.clock)
        self.members.append(m)
        self.backends[name] = backend
        return m

    def _complete_until(self, t: float) -> None:
        while self._done and self._done[0][0] <= t:
            when, _, m = heapq.heappop(self._done)
            self.clock.t = when
            b = self.backends[m.name]
            m.end(b.latency, ok=b.ok)

    def run(self, seconds: float) -> Counter[str]:
        """Run for `seconds` of simulated time; returns picks per member in that span."""
        counts: Counter[str] = Counter()
        end = self.clock.t + seconds
        t = self.clock.t
        while True:
            t += self.rng.expovariate(self.rate)
            if t > end:
                break
            self._complete_until(t)
            self.clock.t = t
            m = self.balancer.pick(self.members, rng=self.rng)
            assert m is not None
            m.begin()
            self.peak[m.name] = max(self.peak[m.name], m.inflight)
            if not m.ewma.has_history:
                self.unmeasured_peak[m.name] = max(self.unmeasured_peak[m.name], m.inflight)
            counts[m.name] += 1
            self._seq += 1
            heapq.heappush(self._done, (t + self.backends[m.name].latency, self._seq, m))
        self._complete_until(end)
        self.clock.t = end
        self.counts.update(counts)
        return counts


def share(counts: Counter[str], name: str) -> float:
    return counts[name] / sum(counts.values())


def test_p2c_sends_little_traffic_to_a_slow_member() -> None:
    sim = Sim(P2CPeakEwma(), rate=20)
    sim.add("fast1", Backend(0.1))
    sim.add("fast2", Backend(0.1))
    sim.add("slow", Backend(1.0))
    sim.run(5)  # learn
    counts = sim.run(60)
    assert share(counts, "slow") < 0.06  # uniform would be 0.33
    assert abs(share(counts, "fast1") - share(counts, "fast2")) < 0.1


def test_p2c_penalises_a_fast_failing_member() -> None:
    sim = Sim(P2CPeakEwma(), rate=20)
    sim.add("a", Backend(0.3))
    sim.add("b", Backend(0.3))
    sim.add("broken", Backend(0.002, ok=False))  # answers errors at once
    counts = sim.run(60)
    assert share(counts, "broken") < 0.05
    assert sim.members[2].failures == counts["broken"] > 0


def test_p2c_avoids_a_member_whose_answers_turn_broken() -> None:
    """A member that served well, then answers fast but broken (a 200 with garbage): its broken
    answers are failures, so it is avoided; counted as successes it would draw most traffic."""
    for broken_ok, low, high in ((False, 0.0, 0.2), (True, 0.5, 1.0)):
        sim = Sim(P2CPeakEwma(), rate=20)
        sim.add("a", Backend(0.3))
        sim.add("b", Backend(0.3))
        sim.add("turns", Backend(0.3))
        sim.run(10)
        sim.backends["turns"] = Backend(0.002, ok=broken_ok)
        got = share(sim.run(60), "turns")
        assert low <= got <= high, (broken_ok, got)


def test_p2c_probes_a_new_member_without_flooding_it() -> None:
    sim = Sim(P2CPeakEwma(), rate=50)
    sim.add("a", Backend(0.2))
    sim.add("b", Backend(0.2))
    sim.run(10)
    sim.add("new-slow", Backend(3.0))  # joins; its first answer takes 3 s
    before_first_answer = sim.run(3.0)
    assert before_first_answer["new-slow"] >= 1  # probed
    assert sim.unmeasured_peak["new-slow"] == 1  # never more than one blind request
    later = sim.run(30)
    assert share(later, "new-slow") < 0.05


def test_p2c_ramps_up_a_new_fast_member() -> None:
    sim = Sim(P2CPeakEwma(), rate=50)
    sim.add("a", Backend(0.4))
    sim.add("b", Backend(0.4))
    sim.run(10)
    sim.add("new-fast", Backend(0.1))
    counts = sim.run(30)
    assert sim.unmeasured_peak["new-fast"] == 1
    assert share(counts, "new-fast") > 0.45  # preferred once measured


def test_p2c_respects_max_inflight_under_load() -> None:
    sim = Sim(P2CPeakEwma(), rate=40)
    sim.add("a", Backend(0.05), max_inflight=2)
    sim.add("b", Backend(0.3), max_inflight=20)
    sim.run(20)
    assert sim.peak["a"] == 2  # the fast member is always full, never over
    assert sim.counts["a"] > 0 and sim.counts["b"] > 0


@pytest.mark.parametrize("strategy", ["p2c_peak_ewma", "round_robin", "weighted", "least_busy"])
def test_every_strategy_respects_capacity_and_eligibility(strategy: str) -> None:
    balancer = make_balancer(strategy)  # type: ignore[arg-type]
    members = [Member(n, max_inflight=2) for n in "abc"]
    rng = random.Random(3)
    not_c: Callable[[Member], bool] = lambda m: m.name != "c"  # noqa: E731
    picked: list[str] = []
    while (m := balancer.pick(members, not_c, rng)) is not None:
        m.begin()
        picked.append(m.name)
    assert sorted(picked) == ["a", "a", "b", "b"]
    assert balancer.pick([], rng=rng) is None
    solo = Member("solo")
    assert balancer.pick([solo], rng=rng) is solo


def test_round_robin_cycles_and_skips() -> None:
    rr = RoundRobin()
    members = [Member(n) for n in "abc"]
    names = [rr.pick(members).name for _ in range(300)]  # type: ignore[union-attr]
    assert names[:6] == ["a", "b", "c", "a", "b", "c"]
    assert Counter(names) == {"a": 100, "b": 100, "c": 100}
    skip_b = [rr.pick(members, lambda m: m.name != "b").name for _ in range(100)]  # type: ignore[union-attr]
    assert Counter(skip_b) == {"a": 50, "c": 50}


def test_smooth_weighted_matches_nginx_sequence() -> None:
    sw = SmoothWeighted()
    members = [Member("a", weight=5), Member("b", weight=1), Member("c", weight=1)]
    seq = [sw.pick(members).name for _ in range(7)]  # type: ignore[union-attr]
    assert seq == ["a", "a", "b", "a", "c", "a", "a"]  # spread, not a,a,a,a,a,b,c
    more = Counter(sw.pick(members).name for _ in range(700))  # type: ignore[union-attr]
    assert more == {"a": 500, "b": 100, "c": 100}


def test_weight_zero_is_never_picked() -> None:
    members = [Member("a", weight=1), Member("off", weight=0)]
    for strategy in ("p2c_peak_ewma", "round_robin", "weighted", "least_busy"):
        b = make_balancer(strategy)  # type: ignore[arg-type]
        assert {b.pick(members, rng=random.Random(i)).name for i in range(50)} == {"a"}  # type: ignore[union-attr]


def test_least_busy_picks_fewest_in_flight_and_breaks_ties_evenly() -> None:
    lb = LeastBusy()
    members: Sequence[Member] = [Member(n) for n in "abcd"]
    members[0].inflight = 3
    members[1].inflight = 1
    rng = random.Random(7)
    ties = Counter(lb.pick(members, rng=rng).name for _ in range(4000))  # type: ignore[union-attr]
    assert set(ties) == {"c", "d"}
    assert abs(ties["c"] - ties["d"]) < 250
    members[2].inflight = members[3].inflight = 5
    assert lb.pick(members, rng=rng).name == "b"  # type: ignore[union-attr]


def test_make_balancer_from_name_or_settings() -> None:
    assert isinstance(make_balancer(BalancerSettings()), P2CPeakEwma)
    assert isinstance(make_balancer(BalancerSettings(strategy="weighted")), SmoothWeighted)
    assert isinstance(make_balancer("least_busy"), LeastBusy)
    with pytest.raises(ValueError):
        make_balancer("random")  # type: ignore[arg-type]


def test_fast_failures_lower_the_success_share_not_the_latency() -> None:
    """A member failing fast costs more than an equally fast healthy one, but stays in play."""
    healthy = Member("healthy", clock=lambda: 1000.0)
    flaky = Member("flaky", clock=lambda: 1000.0)
    for m in (healthy, flaky):
        for _ in range(5):
            m.begin()
            m.end(0.05)
    for _ in range(3):
        flaky.begin()
        flaky.fail_fast("upstream_5xx")
    assert flaky.ewma.estimate() == healthy.ewma.estimate()
    assert 1.2 < flaky.cost() / healthy.cost() < 2.0
    for _ in range(50):
        flaky.begin()
        flaky.fail_fast("connect_error")
    assert flaky.cost() / healthy.cost() == pytest.approx(20.0, rel=0.05)
    for _ in range(30):
        flaky.begin()
        flaky.end(0.05)
    assert flaky.cost() / healthy.cost() < 1.1
