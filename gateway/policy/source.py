"""Reading a policy's YAML safely: bounded size, bounded alias expansion, and where each field is.

YAML anchors let a few hundred bytes describe millions of nodes ("billion laughs"); PyYAML shares
the aliased objects, but everything that walks the result afterwards (interpolation, validation)
expands them. The composed node graph is measured first, so such a file is refused before anything
expands it. The same graph gives the line of every field path, for error messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

# A real policy is a few KB; these bounds are far above any legitimate file.
MAX_BYTES = 1024 * 1024
MAX_NODES = 200_000  # nodes after alias expansion
MAX_ALIASES = 1_000


class YamlLimitError(ValueError):
    """The document is too big, or expands to too many nodes."""


@dataclass(slots=True)
class SourceMap:
    """Field path ("pools.main.members.0") -> 1-based line in the file."""

    lines: dict[str, int] = field(default_factory=dict)

    def line_of(self, path: str) -> int | None:
        """The line of `path`, or of its nearest ancestor present in the file."""
        while True:
            line = self.lines.get(path)
            if line is not None or not path:
                return line
            path = path.rpartition(".")[0]


def load_yaml(text: str) -> tuple[Any, SourceMap]:
    """Parse YAML text within the limits; returns (data, source map). Raises yaml.YAMLError or
    YamlLimitError."""
    if len(text.encode("utf-8", "replace")) > MAX_BYTES:
        raise YamlLimitError(f"the file is larger than {MAX_BYTES} bytes")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is None:
        return None, SourceMap()
    _check_size(node, text)
    smap = SourceMap()
    _index(node, "", smap.lines, set())
    loader = yaml.SafeLoader("")
    try:
        data = loader.construct_document(node)
    finally:
        loader.dispose()
    return data, smap


def _check_size(root: yaml.Node, text: str) -> None:
    # Aliases are the same node object in the composed graph: expanded sizes are memoised per node.
    if text.count("*") > MAX_ALIASES and _count_aliases(text) > MAX_ALIASES:
        raise YamlLimitError(f"more than {MAX_ALIASES} aliases")
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if depth > 100:
            raise YamlLimitError("nested more than 100 levels")
        total = 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k, depth + 1) + size(v, depth + 1)
                if total > MAX_NODES:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                total += size(v, depth + 1)
                if total > MAX_NODES:
                    break
        if total > MAX_NODES:
            raise YamlLimitError(f"the document expands to more than {MAX_NODES} nodes (aliases)")
        sizes[id(node)] = total
        return total

    size(root, 0)


def _count_aliases(text: str) -> int:
    return sum(1 for t in yaml.scan(text, Loader=yaml.SafeLoader) if isinstance(t, yaml.AliasToken))


def _index(node: yaml.Node, path: str, out: dict[str, int], seen: set[int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:  # an aliased subtree is indexed once, where it is defined
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            child = f"{path}.{key}" if path else key
            out.setdefault(child, k.start_mark.line + 1)
            _index(v, child, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _index(v, f"{path}.{i}" if path else str(i), out, seen)
