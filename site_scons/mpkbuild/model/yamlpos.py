"""YAML loading that remembers where every value came from, and refuses what is unbounded.

Spec errors must name the file, the line and the field path; PyYAML's composed node tree
has the marks, so we construct plain data from it ourselves and keep a path -> line map.
Duplicate keys (which PyYAML silently overwrites) are errors here.

Before anything is composed, one streaming pass over the parser's events refuses anchors
and aliases (an alias bomb expands exponentially at construction), explicit tags other
than the plain JSON types, nesting deeper than config.MAX_YAML_DEPTH and more than
config.MAX_YAML_NODES nodes, so composing and constructing are bounded by the file size.
Only JSON values come out: no dates, sets, binary, or non-finite floats.
"""
from __future__ import annotations

import math

from mpkbuild.util import config

# explicit tags that still mean a plain JSON value (`!!str 123` is a string)
_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}


class YamlPosError(ValueError):
    def __init__(self, line: int, path: tuple, message: str):
        super().__init__(message)
        self.line, self.path, self.message = line, path, message


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, max(position, 0)) + 1


def _yaml_error(exc, text: str) -> YamlPosError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line = mark.line + 1
    elif getattr(exc, "position", None) is not None:          # ReaderError: bad character
        line = _line_of(text, exc.position)
    else:
        line = 1
    problem = str(getattr(exc, "problem", None) or getattr(exc, "reason", None) or exc)
    return YamlPosError(line, (), f"YAML syntax error: {problem[:120]}")


def _screen_events(yaml, loader, text: str) -> None:
    """The streaming pass: refuse aliases, anchors, odd tags, depth and size past the caps,
    naming the field each problem sits in."""
    # per open collection: ["map", key, expecting_key, is_a_key] or ["seq", index, is_a_key]
    stack: list[list] = []
    nodes = 0

    def path() -> tuple:
        out = []
        for frame in stack:
            if frame[0] == "map" and frame[1] is not None:
                out.append(frame[1])
            elif frame[0] == "seq":
                out.append(frame[1])
        return tuple(out)

    def fail(event, message):
        raise YamlPosError(event.start_mark.line + 1, path(), message)

    for event in yaml.parse(text, Loader=loader):
        if not isinstance(event, yaml.NodeEvent):
            if isinstance(event, yaml.CollectionEndEvent):
                _finish_node(stack, was_key=stack.pop()[-1])
            continue
        is_key = bool(stack) and stack[-1][0] == "map" and stack[-1][2]
        if is_key:
            # the key's own path is its parent's plus (once read) the key itself
            stack[-1][1] = event.value if isinstance(event, yaml.ScalarEvent) else "<key>"
        if isinstance(event, yaml.AliasEvent):
            fail(event, f"YAML alias *{event.anchor} is not allowed in a spec: write the value out")
        if event.anchor is not None:
            fail(event, f"YAML anchor &{event.anchor} is not allowed in a spec (aliases are refused)")
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in _PLAIN_TAGS and not (tag == "!" and isinstance(event, yaml.ScalarEvent)):
            fail(event, f"YAML tag {_short(tag)} is not allowed in a spec (plain values only)")
        nodes += 1
        if nodes > config.MAX_YAML_NODES:
            fail(event, f"more than {config.MAX_YAML_NODES} YAML nodes: a spec is at most that big")
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= config.MAX_YAML_DEPTH:
                fail(event, f"nested deeper than {config.MAX_YAML_DEPTH} levels")
            stack.append(["map", None, True, is_key] if isinstance(event, yaml.MappingStartEvent)
                         else ["seq", 0, is_key])
        else:
            _finish_node(stack, was_key=is_key)


def _finish_node(stack: list, was_key: bool = False) -> None:
    """A node just ended inside the top collection: advance its key/value or index."""
    if not stack:
        return
    top = stack[-1]
    if top[0] == "seq":
        top[1] += 1
    elif was_key:
        top[2] = False
    else:
        top[2] = True


def load_with_lines(text: str) -> tuple[object, dict[tuple, int]]:
    """Parse YAML text; return (data, {path tuple: 1-based line})."""
    import yaml   # only a full spec load parses YAML; cached loads never import it
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml: same marks, 10x faster
    try:
        _screen_events(yaml, loader, text)
        node = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text) from None
    lines: dict[tuple, int] = {}
    if node is None:
        return None, {(): 1}
    constructor = yaml.SafeLoader("")

    def scalar(n, path):
        try:
            value = constructor.construct_object(n, deep=True)
        except Exception as exc:   # noqa: BLE001 - `!!int x`, 5000-digit ints: any of several
            if n.tag == "tag:yaml.org,2002:merge":
                raise YamlPosError(n.start_mark.line + 1, path + ("<<",),
                                   "YAML merge keys (<<) are not allowed in a spec: write the fields out") from None
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:80]
            raise YamlPosError(n.start_mark.line + 1, path,
                               f"YAML value {_short(n.value)} cannot be read: {reason}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise YamlPosError(n.start_mark.line + 1, path,
                               f"{n.value} is not a finite number (a spec has no use for inf or nan)")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise YamlPosError(n.start_mark.line + 1, path,
                               f"{_short(n.value)} reads as a YAML {type(value).__name__}, not a plain "
                               "value: quote it to make a string")
        return value

    def build(n, path):
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out = {}
            for key_node, value_node in n.value:
                key = scalar(key_node, path) if isinstance(key_node, yaml.ScalarNode) else key_node
                if not isinstance(key, str):
                    raise YamlPosError(key_node.start_mark.line + 1, path,
                                       f"mapping key {_short(key if not isinstance(key, yaml.Node) else '<collection>')} is not a string")
                if key in out:
                    raise YamlPosError(key_node.start_mark.line + 1, path + (key,),
                                       f"duplicate key {_short(key)}")
                lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = build(value_node, path + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, path + (i,)) for i, item in enumerate(n.value)]
        return scalar(n, path)

    return build(node, ()), lines


def line_for(lines: dict[tuple, int], path: tuple) -> int:
    """The line of the deepest known prefix of path (a missing field points at its parent)."""
    path = tuple(path)
    while path and path not in lines:
        path = path[:-1]
    return lines.get(path, 1)


def format_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top>"
