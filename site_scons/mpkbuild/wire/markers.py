"""Marked blocks: the only text the wire stage ever adds to, or removes from, a checkout.

A block is whole lines: a begin marker comment carrying the block key
(`<kernel>/<arch>/<site>`, arch `any` for per-kernel sites) and the sha of the body's code,
the body, and an end marker with the same key. Owns making a block, finding all blocks in a
file (refusing half-deleted or interleaved ones with :class:`MarkerError`) and telling
whether a block's body still is the code its sha vouches for (drift).

The sha is of the body's token stream (:func:`code_tokens`: comments dropped, whitespace and
line breaks ignored, adjacent string literals joined), not of its bytes: a tree reformatted
by its owner (any clang-format style, re-indented, re-wrapped) keeps every block ours, and
only a change to the code itself is a hand edit. A block written by an older version, whose
sha is of the bytes, is recognised too.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .errors import MarkerError

ANY_ARCH = "any"


def block_key(kernel: str, arch: str | None, site: str) -> str:
    return f"{kernel}/{arch or ANY_ARCH}/{site}"


def split_key(key: str) -> tuple[str, str, str]:
    kernel, arch, site = key.split("/", 2)
    return kernel, arch, site


def body_sha(body: str) -> str:
    """The sha of a body's bytes (what markers recorded before they recorded code_sha)."""
    return hashlib.sha256(body.encode()).hexdigest()[:12]


_STRING = r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\''
_C_TOKEN = re.compile(rf"{_STRING}|/\*.*?\*/|//[^\n]*|\w+|\S", re.S)
_PY_TOKEN = re.compile(rf"{_STRING}|#[^\n]*|\w+|\S", re.S)


def comment_style(path: str) -> str:
    """"#" for Python files, "//" for the C++ family."""
    return "#" if path.endswith(".py") else "//"


def code_tokens(text: str, style: str = "//") -> list[str]:
    """The code of a text as tokens: comments dropped (// and /* */ for C++, # for Python),
    whitespace and line breaks ignored, adjacent string literals joined (what clang-format
    does when it wraps a long literal)."""
    out: list[str] = []
    for m in (_PY_TOKEN if style == "#" else _C_TOKEN).finditer(text):
        tok = m.group(0)
        if tok.startswith(("//", "/*") if style != "#" else "#"):
            continue
        if out and tok[:1] in "\"'" and out[-1][:1] == tok[:1] and len(out[-1]) > 1 and len(tok) > 1:
            out[-1] = out[-1][:-1] + tok[1:]
            continue
        out.append(tok)
    return out


def code_sha(body: str, style: str = "//") -> str:
    return hashlib.sha256("\x00".join(code_tokens(body, style)).encode()).hexdigest()[:12]


def same_code(a: str, b: str, style: str = "//") -> bool:
    return code_tokens(a, style) == code_tokens(b, style)


def indent_body(text: str, indent: int) -> str:
    """Template output -> block body: every non-empty line indented, one trailing newline."""
    pad = " " * indent
    lines = text.rstrip("\n").split("\n")
    return "".join((pad + ln if ln.strip() else "") + "\n" for ln in lines)


@dataclass(frozen=True)
class Block:
    key: str
    sha: str              # recorded in the begin marker
    start: int            # line index of the begin marker
    end: int              # line index of the end marker
    body: str             # lines between the markers, as they are now
    style: str = "//"     # the file's comment leader (its language)

    @property
    def kernel(self) -> str:
        return split_key(self.key)[0]

    @property
    def drifted(self) -> bool:
        """Whether the code was edited by hand (formatting is not an edit)."""
        return self.sha not in (code_sha(self.body, self.style), body_sha(self.body))


class Markers:
    """Marker syntax from surface.yaml (`begin`/`end` with {key} and {sha} fields)."""

    def __init__(self, begin: str, end: str, read: tuple = ()):
        self.begin_fmt, self.end_fmt = begin, end
        self._begins = [self._regex(b) for b in (begin, *(r[0] for r in read))]
        self._ends = [self._regex(e) for e in (end, *(r[1] for r in read))]

    @staticmethod
    def _match(regexes, text: str):
        return next((m for m in (rx.match(text) for rx in regexes) if m), None)

    @staticmethod
    def _regex(fmt: str):
        pat = re.escape(fmt).replace(r"\{key\}", r"(?P<key>[\w./-]+)").replace(
            r"\{sha\}", r"(?P<sha>[0-9a-f]+)")
        return re.compile(r"^[ \t]*\S+[ \t]*" + pat + r"[ \t]*$")

    def make(self, key: str, body: str, indent: int, comment: str) -> str:
        pad = " " * indent
        begin = self.begin_fmt.format(key=key, sha=code_sha(body, comment))
        end = self.end_fmt.format(key=key)
        return f"{pad}{comment} {begin}\n{body}{pad}{comment} {end}\n"

    def is_marker(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        return bool(self._match(self._begins, text) or self._match(self._ends, text))

    def find(self, lines: list[str], path: str) -> list[Block]:
        """All blocks in a file's lines (keepends); MarkerError for broken ones."""
        blocks, open_ = [], None
        for i, line in enumerate(lines):
            text = line.rstrip("\r\n")
            b, e = self._match(self._begins, text), self._match(self._ends, text)
            if b:
                if open_ is not None:
                    raise MarkerError(
                        f"{path}:{open_[0] + 1}: block {open_[1]} has no end marker before "
                        f"the next block begins at line {i + 1} (half-deleted?). Restore the "
                        f"end line '{self.end_fmt.format(key=open_[1])}' or remove the whole "
                        "block by hand, then re-run")
                open_ = (i, b.group("key"), b.group("sha"))
            elif e:
                if open_ is None or e.group("key") != open_[1]:
                    raise MarkerError(
                        f"{path}:{i + 1}: end marker for {e.group('key')} has no matching "
                        "begin marker (half-deleted block?). Restore the begin line or "
                        "remove the block's remaining lines by hand, then re-run")
                blocks.append(Block(key=open_[1], sha=open_[2], start=open_[0], end=i,
                                    body="".join(lines[open_[0] + 1:i]), style=comment_style(path)))
                open_ = None
        if open_ is not None:
            raise MarkerError(
                f"{path}:{open_[0] + 1}: block {open_[1]} has a begin marker but no end "
                f"marker (half-deleted?). Restore '{self.end_fmt.format(key=open_[1])}' or "
                "remove the block's remaining lines by hand, then re-run")
        keys = [b.key for b in blocks]
        for k in keys:
            if keys.count(k) > 1:
                raise MarkerError(f"{path}: block {k} appears {keys.count(k)} times; "
                                  "keep one and delete the others by hand")
        return blocks
