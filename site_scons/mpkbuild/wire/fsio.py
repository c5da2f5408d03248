"""Writing files without ever leaving one half-written.

Owns :func:`commit` (a set of file writes and deletions for one checkout: every target is
checked for writability first, every new text is written to a temp file beside its target,
and only then are the temp files renamed over the targets, keeping each file's mode) and
:func:`write_fragments` (build-folder fragments, written only when their bytes change).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import TargetReadOnly


def _dir_writable(d: Path) -> bool:
    return d.is_dir() and os.access(d, os.W_OK | os.X_OK)


def check_writable(root: Path, rels) -> None:
    """Refuse before anything is written if any target (or its folder) is read-only."""
    for rel in rels:
        p = root / rel
        if p.exists():
            mode = p.stat().st_mode
            # mode bits first: root ignores them in os.access, but a 0444 file is a statement
            ok = bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) \
                and os.access(p, os.W_OK) and _dir_writable(p.parent)
        else:
            ok = _dir_writable(p.parent)
        if not ok:
            raise TargetReadOnly(f"{rel}: cannot write it in {root} (read-only file, or its "
                                 "folder is missing or read-only); fix that, then apply again. "
                                 "Nothing was changed")


def commit(root: Path, writes: dict[str, str], deletes: list[str]) -> None:
    """Write/delete files under root, all-or-nothing up to the final renames."""
    check_writable(root, list(writes) + list(deletes))
    staged: list[tuple[str, Path]] = []
    try:
        for rel, text in writes.items():
            target = root / rel
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".wire-tmp",
                                       dir=target.parent)
            staged.append((tmp, target))
            with os.fdopen(fd, "wb") as fh:
                fh.write(text.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            if target.exists():
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
            else:
                os.chmod(tmp, 0o644)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    for tmp, target in staged:
        os.replace(tmp, target)
    for rel in deletes:
        (root / rel).unlink(missing_ok=True)


def write_fragments(out_dir: Path | str, fragments: dict[str, str]) -> list[str]:
    """Write fragments into out_dir (atomic, only if changed); drop stale ones.

    Returns the names whose bytes changed or were removed. A hidden manifest
    (`.wire-fragments`) lists what was written last time, so fragments that are no longer
    rendered (a dropped arch) are removed and nothing else in out_dir is touched.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / MANIFEST
    old = set(manifest.read_text().split()) if manifest.is_file() else set()
    changed = []
    for name, text in sorted(fragments.items()):
        if _atomic(out / name, text.encode("utf-8")):
            changed.append(name)
    for name in sorted(old - set(fragments)):
        if (out / name).is_file():
            (out / name).unlink()
            changed.append(name)
    _atomic(manifest, "".join(n + "\n" for n in sorted(fragments)).encode())
    return changed


MANIFEST = ".wire-fragments"


def _atomic(target: Path, raw: bytes) -> bool:
    from mpkbuild.util.fsutil import write_atomic
    return write_atomic(target, raw, only_if_changed=True)
