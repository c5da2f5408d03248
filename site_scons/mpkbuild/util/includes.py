"""The headers a task body includes from outside the build: its spec's include folders
(`codegen.include_dirs`, e.g. an MPK checkout's include/mirage/persistent_kernel), followed
through every header found there. They are inputs of the compile like the body itself, so an
edit of an included real header makes the compile stale in -n, status, why= and the build.

A header is looked for where the compiler looks: a quoted include beside the file that
includes it, then in the include folders; an angle one in the folders only. Headers found
nowhere (the CUDA toolkit's, the system's) are the toolchain's, a fact of their own.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
MAX_HEADERS = 20_000           # a folder of a whole library (CUTLASS) stays bounded


def headers(sources: list[Path], include_dirs: list[Path]) -> list[Path]:
    """Every header `sources` include (transitively) that lies in `include_dirs` or is
    reached from one there, sorted; the sources themselves are not listed."""
    dirs = [Path(d) for d in include_dirs]
    found: dict[str, Path] = {}
    todo = [(Path(s), True) for s in sources]
    seen_sources = {os.path.realpath(s) for s, _ in todo}
    while todo and len(found) < MAX_HEADERS:
        path, is_source = todo.pop()
        try:
            text = path.read_bytes()
        except OSError:
            continue
        for quote, name in _INCLUDE.findall(text):
            name = name.decode(errors="replace").strip()
            # a quoted include of a body copied into build/ is looked for beside the body's
            # source, which is not where the compiler looks: only the folders count for it
            places = ([] if is_source else [path.parent]) if quote == b'"' else []
            for base in [*places, *dirs]:
                cand = base / name
                if cand.is_file():
                    real = os.path.realpath(cand)
                    if real not in found and real not in seen_sources:
                        found[real] = Path(os.path.normpath(cand))
                        todo.append((found[real], False))
                    break
    return sorted(found.values())
