"""Cost and accuracy of prompt token estimation on the classification path.

Run: PYTHONPATH=. python -m loadtests.classify_cost [--iterations 200]

For chat prompts of ~300 and ~100k tokens (English prose, JSON, Chinese and
a mix of the three) it prints the p50/p99 time of `estimate_prompt` with the
default character budget (bounded) and with exact counting, and the relative
error of the bounded estimate against the exact count.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.wire.tokens import count_text, estimate_prompt

_ENGLISH = [
    "The gateway forwards each request to the member with the lowest expected cost.",
    "Operators describe pools, classes and fallbacks in a small YAML file.",
    "When a provider slows down, traffic drains away from it within seconds.",
    "A cached answer is returned only when the question really is the same.",
    "Long documents are summarised by a model with a large context window.",
    "Please read the attached report and list the three most important risks.",
    "Our quarterly revenue grew by 12 percent, driven mostly by new customers in Europe.",
    "The committee postponed its decision until the engineering review is complete.",
    "Remember to rotate the credentials before the audit starts next Tuesday.",
    "In 1969, the first message was sent over the network that later became the Internet.",
    "She wrote the migration script, tested it twice, and deployed it on Friday evening.",
    "Latency matters more than throughput for people typing into a chat window.",
]
_CHINESE = [
    "网关会把每个请求转发给预期成本最低的成员。",
    "运维人员在一个简单的配置文件中描述资源池、请求类别和降级策略。",
    "当某个服务变慢时，流量会在几秒钟内转移到其他节点。",
    "只有在问题确实相同的情况下，才会返回缓存的答案。",
    "请阅读附件中的报告，并列出三个最重要的风险。",
    "我们本季度的收入增长了百分之十二，主要来自欧洲的新客户。",
    "委员会决定等工程评审完成后再做决定。",
    "对于在聊天窗口中输入文字的用户来说，延迟比吞吐量更重要。",
]


def english(n_chars: int, seed: int = 1) -> str:
    """Shuffled English sentences, about `n_chars` long."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        s = rng.choice(_ENGLISH)
        out.append(s)
        size += len(s) + 1
    return " ".join(out)[:n_chars]


def chinese(n_chars: int, seed: int = 2) -> str:
    """Shuffled Chinese sentences, about `n_chars` long."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        s = rng.choice(_CHINESE)
        out.append(s)
        size += len(s)
    return "".join(out)[:n_chars]


def json_text(n_chars: int, seed: int = 3) -> str:
    """A JSON array of generated records, about `n_chars` long."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    size = 0
    while size < n_chars:
        rec = {
            "id": rng.randrange(10**9),
            "name": rng.choice(["alice", "bob", "carol", "dave"]) + str(rng.randrange(1000)),
            "score": round(rng.random() * 100, 3),
            "tags": rng.sample(["red", "green", "blue", "fast", "slow", "new"], 2),
            "active": rng.random() < 0.5,
        }
        records.append(rec)
        size += len(orjson.dumps(rec)) + 1
    return orjson.dumps(records, option=orjson.OPT_INDENT_2).decode()[:n_chars]


def mixed(n_chars: int, seed: int = 4) -> str:
    """Prose, then JSON, then Chinese: a heterogeneous prompt."""
    third = n_chars // 3
    return english(third, seed) + "\n" + json_text(third, seed) + "\n" + chinese(third, seed)


# Characters per token measured on these corpora (cl100k_base), to size prompts.
_CHARS_PER_TOKEN = {"english": 5.25, "json": 2.74, "chinese": 0.94, "mixed": 1.85}
KINDS: dict[str, Callable[[int, int], str]] = {
    "english": english,
    "json": json_text,
    "chinese": chinese,
    "mixed": mixed,
}


def chat_body(kind: str, target_tokens: int, model: str = "gpt-4") -> dict[str, Any]:
    """A chat request of roughly `target_tokens` prompt tokens of one kind of text."""
    n_chars = int(target_tokens * _CHARS_PER_TOKEN[kind])
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": KINDS[kind](n_chars, 7)},
        ],
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _timings(fn: Callable[[], int], iterations: int) -> list[float]:
    fn()  # warm up
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure(kind: str, target_tokens: int, iterations: int) -> dict[str, float]:
    """Timings (ms) and relative error of the bounded estimate for one prompt."""
    body = chat_body(kind, target_tokens)
    exact = estimate_prompt(body, char_budget=0)
    bounded = estimate_prompt(body)
    t_bounded = _timings(lambda: estimate_prompt(body), iterations)
    t_exact = _timings(lambda: estimate_prompt(body, char_budget=0), max(iterations // 10, 5))
    return {
        "tokens": exact,
        "chars": sum(len(m["content"]) for m in body["messages"]),
        "p50_ms": statistics.median(t_bounded) * 1e3,
        "p99_ms": _percentile(t_bounded, 0.99) * 1e3,
        "exact_p50_ms": statistics.median(t_exact) * 1e3,
        "rel_err": (bounded - exact) / exact,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    count_text("warm up the encoder")
    print(
        f"{'prompt':<16}{'tokens':>8}{'chars':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'exact p50 ms':>14}{'rel err':>9}"
    )
    for target in (300, 100_000):
        for kind in KINDS:
            r = measure(kind, target, args.iterations)
            print(
                f"{kind + ' ' + str(target):<16}{r['tokens']:>8}{r['chars']:>9}"
                f"{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['exact_p50_ms']:>14.2f}"
                f"{r['rel_err']:>+9.2%}"
            )


if __name__ == "__main__":
    main()
