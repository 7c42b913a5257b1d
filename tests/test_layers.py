"""Layers of the code base, checked on the source with `ast` (nothing is imported).

The gateway and the instruments that measure it stay apart:
- the gateway (gateway/) never imports the load tests (loadtests/) nor the tests (tests/); its
  demo modes start the simulator and llama.cpp servers as child processes (`python -m ...`);
- the instruments (loadtests/) never import the tests: tests may use loadtests helpers, not the
  reverse;
- the simulator, the load generator and the processes they drive import nothing from the gateway,
  so that what measures the gateway does not share code with what it measures.

Every import counts: at the top of a module, inside functions, under `if TYPE_CHECKING:`, and
`importlib.import_module("...")` / `__import__("...")` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = ROOT / "gateway"
LOADTESTS = ROOT / "loadtests"
#: Instruments that must not share code with the gateway: the simulator, the load generator
#: (loadtests/bench*), the llama.cpp launcher, the gateway-process helper, the KV-cache benchmark.
INDEPENDENT = [
    LOADTESTS / "simulator",
    LOADTESTS / "bench",
    LOADTESTS / "llama",
    LOADTESTS / "processes.py",
    LOADTESTS / "llama_bench.py",
]


def _sources(*places: Path) -> list[Path]:
    files: list[Path] = []
    for place in places:
        assert place.exists(), f"{place} is missing: update this test's list"
        files += [place] if place.is_file() else sorted(place.rglob("*.py"))
    return files


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if name in ("import_module", "__import__") and literal:
                yield node.lineno, first.value


def _violations(files: Iterable[Path], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in files:
        for line, module in sorted(_imports(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.append(f"{where}:{line} imports {module}")
    return out


def _check(files: list[Path], forbidden: tuple[str, ...], minimum: int) -> None:
    assert len(files) >= minimum, f"only {len(files)} files found: is the layout still the same?"
    bad = _violations(files, forbidden)
    assert not bad, f"imports of {', '.join(forbidden)} where none may be:\n  " + "\n  ".join(bad)


def test_gateway_imports_neither_loadtests_nor_tests() -> None:
    _check(_sources(GATEWAY), ("loadtests", "tests"), minimum=50)


def test_loadtests_do_not_import_tests() -> None:
    _check(_sources(LOADTESTS), ("tests",), minimum=30)


def test_simulator_and_load_generator_import_nothing_from_the_gateway() -> None:
    _check(_sources(*INDEPENDENT), ("gateway",), minimum=30)


def test_the_checks_see_every_kind_of_import(tmp_path: Path) -> None:
    """The walker finds imports in functions, under TYPE_CHECKING and by name."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from loadtests.simulator import testing\n"
        "def f():\n"
        "    import tests.support as s\n"
        "    return importlib.import_module('gateway.routing')\n"
        "from . import sibling\n"
    )
    found = {module for _, module in _imports(sample)}
    assert {"loadtests.simulator", "tests.support", "gateway.routing"} <= found
    assert _violations([sample], ("loadtests",)) == [f"{sample}:3 imports loadtests.simulator"]
    assert _violations([sample], ("gateway", "tests")) == [
        f"{sample}:5 imports tests.support",
        f"{sample}:6 imports gateway.routing",
    ]
