"""Marked blocks: the only text the wire stage ever adds to, or removes from, a checkout.

A block is whole lines: a begin marker comment carrying the block key
(`<kernel>/<arch>/<site>`, arch `any` for per-kernel sites) and the sha of the body as
written, the body, and an end marker with the same key. Owns making a block, finding all
blocks in a file (refusing half-deleted or interleaved ones with :class:`MarkerError`) and
telling whether a block's body still matches its recorded sha (drift).
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
    return hashlib.sha256(body.encode()).hexdigest()[:12]


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

    @property
    def kernel(self) -> str:
        return split_key(self.key)[0]

    @property
    def drifted(self) -> bool:
        return body_sha(self.body) != self.sha


class Markers:
    """Marker syntax from surface.yaml (`begin`/`end` with {key} and {sha} fields)."""

    def __init__(self, begin: str, end: str):
        self.begin_fmt, self.end_fmt = begin, end
        self._begin = self._regex(begin)
        self._end = self._regex(end)

    @staticmethod
    def _regex(fmt: str):
        pat = re.escape(fmt).replace(r"\{key\}", r"(?P<key>[\w./-]+)").replace(
            r"\{sha\}", r"(?P<sha>[0-9a-f]+)")
        return re.compile(r"^[ \t]*\S+[ \t]*" + pat + r"[ \t]*$")

    def make(self, key: str, body: str, indent: int, comment: str) -> str:
        pad = " " * indent
        begin = self.begin_fmt.format(key=key, sha=body_sha(body))
        end = self.end_fmt.format(key=key)
        return f"{pad}{comment} {begin}\n{body}{pad}{comment} {end}\n"

    def find(self, lines: list[str], path: str) -> list[Block]:
        """All blocks in a file's lines (keepends); MarkerError for broken ones."""
        blocks, open_ = [], None
        for i, line in enumerate(lines):
            text = line.rstrip("\r\n")
            b, e = self._begin.match(text), self._end.match(text)
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
                                    body="".join(lines[open_[0] + 1:i])))
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
