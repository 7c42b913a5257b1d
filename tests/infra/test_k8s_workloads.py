"""Every workload the manifests ship, in every overlay (the gateway and what the dev overlay runs
beside it: Redis, the simulator), is probed, sized, bounded and runs as non-root with nothing to
escalate; no credential is written into a ConfigMap or a literal environment value."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.infra.test_k8s import OVERLAYS, render

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
CREDENTIAL_NAME = re.compile(r"(?i)(key|token|secret|passw|credential|auth)")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {o: render(o) for o in OVERLAYS}


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        spec = d["spec"]
        if d["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        out.append((f"{d['kind']}/{d['metadata']['name']}", spec["template"]["spec"]))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_is_probed_sized_and_unprivileged(rendered, overlay: str) -> None:
    pods = pod_specs(rendered[overlay])
    assert pods
    for name, pod in pods:
        assert pod.get("automountServiceAccountToken") is False, name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name
        sc = pod.get("securityContext", {})
        assert sc.get("runAsNonRoot") is True, name
        assert sc.get("runAsUser", 0) != 0, name
        assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name} container {c['name']}"
            for probe in ("readinessProbe", "livenessProbe"):
                assert c.get(probe), f"{where}: no {probe}"
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c.get("resources", {}).get(kind, {})), where
            csc = c.get("securityContext", {})
            assert csc.get("allowPrivilegeEscalation") is False, where
            assert csc.get("readOnlyRootFilesystem") is True, where
            assert not csc.get("privileged"), where
            assert csc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert csc.get("runAsUser", 1) != 0, where
        for v in pod.get("volumes", []):
            assert "hostPath" not in v, f"{name}: volume {v['name']}"
            if "emptyDir" in v:
                assert (v["emptyDir"] or {}).get("sizeLimit"), (
                    f"{name}: volume {v['name']} unbounded"
                )


def _credential_in(name: str, value: str) -> bool:
    if CREDENTIAL_NAME.search(name):
        return True
    for word in re.findall(r"[a-z][a-z0-9+.-]*://\S+", value):
        with_port = urlsplit(word.rstrip("'\",}"))
        if with_port.password or with_port.username:
            return True
    return bool(re.search(r"\bsk-[A-Za-z0-9_-]{8,}|Bearer\s+\S{8,}", value))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_credential_in_a_config_map_or_a_literal(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    for d in docs:
        if d["kind"] == "ConfigMap":
            for key, value in (d.get("data") or {}).items():
                if key.endswith((".yaml", ".yml")):
                    # Files (the policy, the rules): names of variables are fine, values not.
                    assert not _credential_in("", value), f"ConfigMap/{d['metadata']['name']}"
                else:
                    assert not _credential_in(key, value), (
                        f"ConfigMap/{d['metadata']['name']} {key}"
                    )
    for name, pod in pod_specs(docs):
        for c in pod["containers"]:
            for e in c.get("env", []):
                if "value" in e:
                    assert not _credential_in(e["name"], str(e["value"])), f"{name} {e['name']}"


def test_the_checks_catch_what_they_claim() -> None:
    assert _credential_in("API_KEY", "x")
    assert _credential_in("REDIS", "redis://:hunter2@redis:6379/0")
    assert _credential_in("NOTE", "use sk-abcdefgh12345 here")
    assert not _credential_in("PROVIDER_A_URL", "http://simulator:9101/v1")
    assert not _credential_in("", "api_key_env: PROVIDER_A_API_KEY")
