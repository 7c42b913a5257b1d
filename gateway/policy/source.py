"""Reading a policy's YAML safely: bounded size, depth and alias expansion, no duplicate keys, and
where each field is.

YAML anchors let a few hundred bytes describe millions of nodes ("billion laughs"); PyYAML shares
the aliased objects, but everything that walks the result afterwards (interpolation, validation)
expands them. The composed node graph is measured first, so such a file is refused before anything
expands it. PyYAML composes recursively, so the nesting depth is bounded while composing (a file
nested 1000 deep would otherwise exhaust Python's stack). The same graph gives the line of every
field path, for error messages, and shows keys given twice in one mapping (PyYAML keeps the last
silently: a second `sim-a:` block would replace the first).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# A real policy is a few KB; these bounds are far above any legitimate file.
MAX_BYTES = 1024 * 1024
MAX_NODES = 200_000  # nodes after alias expansion
MAX_ALIASES = 1_000
MAX_DEPTH = 100  # nested mappings/sequences
MAX_INT_DIGITS = 100  # an integer scalar (Python refuses to read more than 4300 digits)
_INT_TAG = "tag:yaml.org,2002:int"
_SURROGATE = re.compile("[\ud800-\udfff]")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlLimitError(ValueError):
    """The document is too big, too deep, or expands to too many nodes."""


@dataclass(frozen=True, slots=True)
class DuplicateKey:
    """A key given again in the same mapping: `path` at `line`, first given at `first_line`."""

    path: str
    line: int
    first_line: int


@dataclass(slots=True)
class SourceMap:
    """Field path ("pools.main.members.0") -> 1-based line in the file, and the duplicate keys."""

    lines: dict[str, int] = field(default_factory=dict)
    duplicates: list[DuplicateKey] = field(default_factory=list)

    def line_of(self, path: str) -> int | None:
        """The line of `path`, or of its nearest ancestor present in the file."""
        while True:
            line = self.lines.get(path)
            if line is not None or not path:
                return line
            path = path.rpartition(".")[0]


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than MAX_DEPTH while composing, before Python's
    recursion limit is reached."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH + 1:
                line = self.peek_event().start_mark.line + 1
                raise YamlLimitError(f"nested more than {MAX_DEPTH} levels (line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class NotAFileError(OSError):
    """The path names something other than a regular file (a FIFO, a device, a folder)."""


def read_bounded(path: str | Path) -> bytes:
    """The bytes of a regular file, at most MAX_BYTES (else YamlLimitError). The size is that of
    what is read, not of a stat beforehand: a device (/dev/zero) or a file growing while read is
    bounded too, and a FIFO is refused without waiting for a writer. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotAFileError(0, f"{what}")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlLimitError(f"the file is larger than {MAX_BYTES} bytes")
    return data


def load_yaml(text: str) -> tuple[Any, SourceMap]:
    """Parse YAML text within the limits; returns (data, source map). Raises yaml.YAMLError or
    YamlLimitError. Duplicate keys are listed in the source map (the data holds the last value)."""
    if len(text.encode("utf-8", "replace")) > MAX_BYTES:
        raise YamlLimitError(f"the file is larger than {MAX_BYTES} bytes")
    composer = _BoundedLoader(text)
    try:
        node = composer.get_single_node()
    except RecursionError:  # a guard: the depth bound above should always come first
        raise YamlLimitError(f"nested more than {MAX_DEPTH} levels") from None
    finally:
        composer.dispose()
    if node is None:
        return None, SourceMap()
    _check_size(node, text)
    loader = yaml.SafeLoader("")
    try:
        smap = SourceMap({"": node.start_mark.line + 1})
        _index(node, "", smap, set(), loader)
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
        if depth > MAX_DEPTH:  # aliases can nest a deep subtree inside another one
            raise YamlLimitError(
                f"nested more than {MAX_DEPTH} levels (line {node.start_mark.line + 1})"
            )
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


def _key_identity(key: yaml.Node, loader: yaml.SafeLoader) -> object | None:
    """What PyYAML would use as the dict key (so `1`, `0x1` and `true` collide as they do there);
    None for keys that cannot collide this way (merge keys, unhashable keys)."""
    if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
        return None
    try:
        value = loader.construct_object(key, deep=True)
        hash(value)
    except Exception:  # noqa: BLE001 - an unconstructible key is reported when constructing
        return (key.tag, key.value)
    return value


def _index(
    node: yaml.Node, path: str, smap: SourceMap, seen: set[int], loader: yaml.SafeLoader
) -> None:
    if id(node) in seen:  # an aliased subtree is indexed once, where it is defined
        return
    seen.add(id(node))
    lines = smap.lines
    if isinstance(node, yaml.MappingNode):
        first: dict[object, int] = {}
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            child = f"{path}.{key}" if path else key
            _check_scalar(k, child[:200])
            line = k.start_mark.line + 1
            ident = _key_identity(k, loader)
            if ident is not None:
                if ident in first:
                    smap.duplicates.append(DuplicateKey(child, line, first[ident]))
                    # The last value is the one used: its lines replace those of the earlier one.
                    prefix = child + "."
                    for stale in [p for p in lines if p.startswith(prefix)]:
                        del lines[stale]
                else:
                    first[ident] = line
            lines[child] = line
            _index(v, child, smap, seen, loader)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            child = f"{path}.{i}" if path else str(i)
            lines[child] = v.start_mark.line + 1
            _index(v, child, smap, seen, loader)
    else:
        _check_scalar(node, path)


def _check_scalar(node: yaml.Node, path: str) -> None:
    line = node.start_mark.line + 1
    if node.tag == _INT_TAG and len(str(node.value)) > MAX_INT_DIGITS:
        raise YamlLimitError(
            f"{path or '<root>'}: an integer of more than {MAX_INT_DIGITS} digits (line {line})"
        )
    if isinstance(node.value, str) and (bad := lone_surrogate(node.value)) is not None:
        # "\ud800" escapes decode to text no encoder accepts: every answer, header or upstream
        # request holding it would fail.
        raise YamlLimitError(f"{path or '<root>'}: {bad} is not a character (line {line})")


def lone_surrogate(text: str) -> str | None:
    """The first UTF-16 surrogate in `text` as `\\udXXX` (not encodable as UTF-8), or None."""
    m = _SURROGATE.search(text)
    return None if m is None else f"\\u{ord(m.group()):04x}"
