"""The loader of the tool's kept jinja2 environments (generate's and the wiring surface's).

An environment kept for a process compiles each template once; jinja2 re-reads a template
whose file's mtime changed, which a same-size edit with its mtime put back gets past. This
loader's check is the file's bytes: a compiled template is used again only while its file
holds the text it was compiled from.
"""
from __future__ import annotations

from pathlib import Path


def _text_or_none(filename: str) -> str | None:
    try:
        return Path(filename).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def same_bytes_loader(search_path: tuple[str, ...]):
    import jinja2      # imported on first use: a status or no-op that renders nothing never does

    class SameBytesLoader(jinja2.FileSystemLoader):
        def get_source(self, environment, template):
            source, filename, _ = super().get_source(environment, template)
            return source, filename, lambda: _text_or_none(filename) == source

    return SameBytesLoader(list(search_path))
