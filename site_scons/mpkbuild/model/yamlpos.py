"""YAML loading that remembers where every value came from.

Spec errors must name the file, the line and the field path; PyYAML's composed node tree
has the marks, so we construct plain data from it ourselves and keep a path -> line map.
Duplicate keys (which PyYAML silently overwrites) are errors here.
"""
from __future__ import annotations



class YamlPosError(ValueError):
    def __init__(self, line: int, path: tuple, message: str):
        super().__init__(message)
        self.line, self.path, self.message = line, path, message


def load_with_lines(text: str) -> tuple[object, dict[tuple, int]]:
    """Parse YAML text; return (data, {path tuple: 1-based line})."""
    import yaml   # only a full spec load parses YAML; cached loads never import it
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml: same marks, 10x faster
    try:
        node = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise YamlPosError(line, (), f"YAML syntax error: {getattr(exc, 'problem', exc)}") from None
    lines: dict[tuple, int] = {}
    if node is None:
        return None, {(): 1}
    constructor = yaml.SafeLoader("")

    def build(n, path):
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out = {}
            for key_node, value_node in n.value:
                key = constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise YamlPosError(key_node.start_mark.line + 1, path,
                                       f"mapping key {key!r} is not a string")
                if key in out:
                    raise YamlPosError(key_node.start_mark.line + 1, path + (key,),
                                       f"duplicate key {key!r}")
                lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = build(value_node, path + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, path + (i,)) for i, item in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

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
