"""Our blocks in the checkout's own C++ style.

A tree's CI checks its format with clang-format and the tree's .clang-format; a block we
write in the shipped templates' style (LLVM, 80 columns) fails that check on a tree of
another style. So before a plan is judged, every marked block of ours in a C++ file is run
through clang-format with the tree's own .clang-format, on the block's lines only
(`--lines`): upstream's lines are never touched, and a block's marker sha is of its code
tokens, not its layout, so a formatted block is still ours, re-applies identically and
unwires byte-exact. A tree without a .clang-format, or a machine without clang-format, keeps
the shipped style, and the plan notes which.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CPP_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")
TIMEOUT_S = 60


def clang_format() -> str | None:
    """clang-format beside this Python (a venv's, `pip install clang-format`), else on PATH."""
    return shutil.which("clang-format", path=os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


def style_file(root: Path) -> Path | None:
    """The tree's .clang-format (or _clang-format), at its root."""
    for name in (".clang-format", "_clang-format"):
        if (Path(root) / name).is_file():
            return Path(root) / name
    return None


def format_blocks(root: Path, rel: str, text: str, blocks) -> str:
    """text with the bodies of `blocks` (markers.Block, 0-based start/end marker lines)
    formatted in the tree's style; upstream's lines and our marker lines unchanged."""
    ranges = [f"--lines={b.start + 2}:{b.end}" for b in blocks if b.end - b.start > 1]
    if not ranges:
        return text
    cmd = [clang_format(), f"--style=file:{style_file(root)}",
           f"--assume-filename={Path(root) / rel}", *ranges]
    proc = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"clang-format failed on {rel}: {proc.stderr.strip()[:400]}")
    return proc.stdout


def restyle(co, changes: dict, kernels, notes: list) -> dict:
    """The plan's changed C++ files with our blocks of `kernels` in the tree's style
    (FileChange, replaced); notes say when the shipped style is kept, and why."""
    from dataclasses import replace
    cpp = [rel for rel, c in changes.items() if c.new is not None and rel.endswith(CPP_SUFFIXES)]
    if not cpp:
        return changes
    if style_file(co.root) is None:
        notes.append(f"{co.root} has no .clang-format: our blocks keep the shipped (LLVM, 80 "
                     "column) style")
        return changes
    if clang_format() is None:
        notes.append("clang-format not found (pip install clang-format, the version the "
                     "tree's CI uses): our blocks keep the shipped style, which the tree's "
                     "format check may want changed")
        return changes
    out = dict(changes)
    for rel in cpp:
        new = changes[rel].new
        ours = [b for b in co.markers.find(new.splitlines(keepends=True), rel) if b.kernel in kernels]
        styled = format_blocks(co.root, rel, new, ours)
        if styled != new:
            out[rel] = replace(changes[rel], new=styled)
    return out
