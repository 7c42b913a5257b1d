"""The layers of gateway/ (ARCHITECTURE.md): every import, type-only ones included, points down or
sideways within its layer, and no module imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GATEWAY = ROOT / "gateway"

# Lowest first. A module may import modules of its own layer or of the layers below it.
LAYERS: list[tuple[str, ...]] = [
    # foundation: the error shape, the per-request context, secret redaction
    ("gateway", "gateway.errors", "gateway.context", "gateway.redact"),
    # the OpenAI wire format: parsing, SSE, answer checks, token estimates
    ("gateway.wire",),
    # Redis, shared state, process membership
    ("gateway.infra",),
    # the parts, each with its own settings model and free of the policy
    (
        "gateway.routing",
        "gateway.resilience",
        "gateway.cache",
        "gateway.providers.settings",
        "gateway.governance.settings",
        "gateway.apis.response_store",
    ),
    # the policy: the parts' settings composed, loaded, cross-checked, watched
    ("gateway.policy",),
    # what reads the policy: provider adapters, the routing decision, keys, degradation rules
    (
        "gateway.providers",
        "gateway.routing.decision",
        "gateway.governance.static_keys",
        "gateway.resilience.degrade_rules",
        "gateway.resilience.degradation",
    ),
    # the live state of one policy version: members, breakers, clients
    ("gateway.runtime",),
    # services the stages call: limits and spend, traces and metrics, other inbound APIs
    ("gateway.governance", "gateway.observability", "gateway.apis"),
    # the request path: stages, attempts, the stream relay
    ("gateway.pipeline",),
    # the ASGI app, the HTTP protocol, admin and dashboard
    ("gateway.http",),
    # entry points
    ("gateway.cli", "gateway.demo", "gateway.children"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in GATEWAY.rglob("*.py")}
    assert len(found) > 100, "the scan found too few modules to mean anything"
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every gateway module `path` imports, anywhere in the file (TYPE_CHECKING blocks and
    function bodies too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith("gateway") and name in known:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) - {name} for name, path in mods.items()}


def layer_of(module: str) -> int:
    best, depth = -1, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS and ARCHITECTURE.md"
    return best


def test_every_module_has_a_layer() -> None:
    for name in modules():
        layer_of(name)


def test_no_import_points_up() -> None:
    up = [
        f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
        for src, dsts in graph().items()
        for dst in sorted(dsts)
        if layer_of(dst) > layer_of(src) and dst != "gateway"
    ]
    assert not up, "imports from a lower layer up:\n" + "\n".join(sorted(up))


def test_no_import_cycle() -> None:
    g = graph()
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_can_fail() -> None:
    """A planted upward import and a planted cycle are both seen."""
    g = {"gateway.wire.a": {"gateway.http.app"}, "gateway.http.app": set()}
    assert any(layer_of(d) > layer_of(s) for s, ds in g.items() for d in ds)
    assert layer_of("gateway.pipeline.stages.cache") > layer_of("gateway.cache.exact")
