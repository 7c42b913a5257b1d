"""Reading a gateway's `/metrics` in the load tests (prometheus_client's own text parser)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metrics_of(base_url: str) -> str:
    """The `/metrics` text of the gateway at `base_url` (with or without its `/v1`)."""
    url = base_url.removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback only
        return r.read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels` (0 when none)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
