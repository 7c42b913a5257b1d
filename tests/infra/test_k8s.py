"""Kubernetes manifests: every overlay renders (`kubectl kustomize`) and validates against the
Kubernetes schemas (`kubernetes-validate`, offline); the pod spec is hardened and sized; the
ConfigMap-mounted policy and rules reload through the symlink swap kubelet does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from gateway.policy.loader import parse_policy, policy_fingerprint
from gateway.resilience.degrade_rules import RuleStore, load_rules
from tests.support import ROOT, free_port, wait_http

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBE_VERSION = "1.32.0"

# The part of KEDA's ScaledObject CRD (keda.sh/v1alpha1) the prod overlay uses; kubernetes-validate
# ships only the built-in kinds.
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer"},
                "cooldownPeriod": {"type": "integer"},
                "advanced": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"enum": ["prometheus", "cpu", "memory"]},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is missing (.ci/run installs kubernetes-client)")
        pytest.skip("kubectl not installed (Debian: kubernetes-client)")
    return path


def render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {o: render(o) for o in OVERLAYS}


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def validate(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    if doc["kind"] == "ScaledObject":
        jsonschema.validate(doc, SCALED_OBJECT)
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_overlays_exist() -> None:
    assert OVERLAYS == ["dev", "prod"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    for doc in docs:
        validate(doc)


def test_validation_catches_mistakes(rendered) -> None:
    """The validator is not a rubber stamp: a misspelt field and a wrong type are refused."""
    import kubernetes_validate

    deployment = one(rendered["dev"], "Deployment", "llm-gateway")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(typo)
    wrong = yaml.safe_load(yaml.safe_dump(deployment))
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(wrong)
    scaled = one(rendered["prod"], "ScaledObject", "llm-gateway")
    bad = yaml.safe_load(yaml.safe_dump(scaled))
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 20  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_is_hardened_probed_and_sized(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    dep = one(docs, "Deployment", "llm-gateway")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["lifecycle"]["preStop"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    # The only writable place is a memory-backed /tmp (metrics files of the workers).
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/tmp" in mounts and _env(c)["PROMETHEUS_MULTIPROC_DIR"]["value"].startswith("/tmp/")
    # Keys and the Redis URL come from Secrets, never from literals in the manifests.
    env = _env(c)
    for name in ("REDIS_URL", "GATEWAY_API_KEYS", "GATEWAY_ADMIN_KEY", "PROVIDER_A_API_KEY"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    # The policy the pods serve is valid with the overlay's environment, and the grace period
    # covers the preStop pause plus the policy's drain deadline.
    cm_env = one(docs, "ConfigMap", "gateway-env")["data"]
    policy = parse_policy(
        one(docs, "ConfigMap", "gateway-policy")["data"]["policy.yaml"], env=cm_env
    )
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + policy.replicas.drain_s + 5
    assert policy.replicas.share_limits
    args = c["args"]
    assert "--policy=/etc/gateway/policy/policy.yaml" in args
    assert policy.degradation.rules == "../fallbacks"
    assert mounts["/etc/gateway/fallbacks"]["name"] == "fallbacks"
    # The PDB and the Service select the Deployment's pods.
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodDisruptionBudget", "Service"):
        doc = one(docs, kind, "llm-gateway")
        sel = doc["spec"]["selector"]
        sel = sel.get("matchLabels", sel)
        assert sel.items() <= labels.items(), kind


def test_fallback_rules_in_the_config_map_are_the_repository_s(tmp_path) -> None:
    ours = (K8S / "base" / "gateway-fallbacks.yaml").read_text()
    assert ours == (ROOT / "fallbacks" / "default.yaml").read_text()
    (tmp_path / "default.yaml").write_text(ours)
    assert load_rules(tmp_path).rules


def test_autoscaling_per_overlay(rendered) -> None:
    dev, prod = rendered["dev"], rendered["prod"]
    hpa = one(dev, "HorizontalPodAutoscaler", "llm-gateway")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "llm-gateway"
    assert one(dev, "Deployment", "redis") and one(dev, "Service", "simulator")
    # prod: KEDA owns scaling (its own HPA); no second HPA on the same Deployment.
    assert not [d for d in prod if d["kind"] == "HorizontalPodAutoscaler"]
    scaled = one(prod, "ScaledObject", "llm-gateway")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "llm-gateway"
    queries = " ".join(t["metadata"].get("query", "") for t in scaled["spec"]["triggers"])
    assert "gateway_admission_queue_depth" in queries and "gateway_member_inflight" in queries
    # prod ships no Secret values: they are created outside the repository.
    assert not [d for d in prod if d["kind"] == "Secret"]


# ---- ConfigMap volumes: kubelet's atomic symlink swap ------------------------------------------

_generation = count(1)


def write_config_map(mount: Path, files: dict[str, str]) -> None:
    """Update a ConfigMap volume the way kubelet does (AtomicWriter): the files go to a new
    timestamped folder, `..data_tmp` is pointed at it and renamed over `..data`, the visible
    names are symlinks `name -> ..data/name`, and the old folder is removed."""
    mount.mkdir(exist_ok=True)
    old = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    stamp = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{next(_generation)}"
    (mount / stamp).mkdir()
    for name, text in files.items():
        (mount / stamp / name).write_text(text)
    (mount / "..data_tmp").symlink_to(stamp)
    os.rename(mount / "..data_tmp", mount / "..data")
    for name in files:
        link = mount / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if old is not None:
        shutil.rmtree(mount / old)


def policy_for(url_a: str, url_b: str, members: str) -> str:
    base = (K8S / "base" / "gateway-policy.yaml").read_text()
    return base.replace("members: [provider-a, provider-b]", f"members: {members}")


@contextlib.contextmanager
def serve(policy: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            + ["--policy", str(policy), "--log-level", "warning"],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _poll(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_config_map_swap_reloads_policy_in_a_running_gateway(tmp_path, fleet) -> None:
    env = {
        "PROVIDER_A_URL": fleet.url("a"),
        "PROVIDER_B_URL": fleet.url("b"),
        "REDIS_URL": "",
        "GATEWAY_READY_PROBE_S": "0.2",
    }
    policy_dir, rules_dir = tmp_path / "policy", tmp_path / "fallbacks"
    rules = (K8S / "base" / "gateway-fallbacks.yaml").read_text()
    first = policy_for(fleet.url("a"), fleet.url("b"), "[provider-a, provider-b]")
    write_config_map(policy_dir, {"policy.yaml": first})
    write_config_map(rules_dir, {"default.yaml": rules})
    with serve(policy_dir / "policy.yaml", env, tmp_path / "gw.log") as url:

        def version() -> str:
            return httpx.get(f"{url}/ready", timeout=5).json()["policy_version"]

        v1 = policy_fingerprint(parse_policy(first, env=env))
        assert version() == v1
        second = policy_for(fleet.url("a"), fleet.url("b"), "[provider-b]")
        write_config_map(policy_dir, {"policy.yaml": second})
        v2 = policy_fingerprint(parse_policy(second, env=env))
        _poll(lambda: version() == v2, "the swapped policy")
        # An invalid version arriving the same way is refused; the running one stays.
        write_config_map(policy_dir, {"policy.yaml": second.replace("p2c_peak_ewma", "fastest")})
        _poll(lambda: "policy reload refused" in (tmp_path / "gw.log").read_text(), "refusal")
        assert version() == v2
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert r.status_code == 200 and r.headers["x-gateway-provider"] == "provider-b"


async def test_config_map_swap_reloads_degradation_rules(tmp_path) -> None:
    mount = tmp_path / "fallbacks"
    rules = (K8S / "base" / "gateway-fallbacks.yaml").read_text()
    write_config_map(mount, {"default.yaml": rules})
    store = RuleStore(mount, debounce_ms=50)
    await store.start()
    try:
        assert store.version == 1
        import asyncio

        await asyncio.sleep(0.3)  # the watcher is running
        changed = rules.replace(
            "\nrules:\n",
            "\nrules:\n  - name: k8s-swap\n    match: {keywords: [swap]}\n    template: swapped\n",
            1,
        )
        write_config_map(mount, {"default.yaml": changed})
        for _ in range(100):
            if store.version >= 2:
                break
            await asyncio.sleep(0.1)
        assert store.version >= 2, store.last_error
        assert any(r.name == "k8s-swap" for r in store.rules.rules)
    finally:
        await store.stop()
