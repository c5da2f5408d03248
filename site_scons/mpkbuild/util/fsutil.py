"""Atomic, change-only file writes and content hashing.

Every generated or result file goes through :func:`write_atomic`: a killed build leaves
either the old file or the new one, never a torn one that a later run would trust.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path


def _read_umask() -> int:
    """This process's umask, read without changing it (os.umask sets it: not thread-safe
    under scons -j, so it is read once, at import)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()
FILE_MODE = 0o666 & ~UMASK       # what open() would make: shared caches stay readable


def temp_name(path: Path) -> str:
    """The prefix of a temporary file beside `path`: it names the writing process, so the
    next build can tell an orphan (its writer is dead) from a file being written."""
    return f".{path.name}.{os.getpid()}-"


TEMP_RE = re.compile(r"^\..+\.(\d+)(?:-[A-Za-z0-9_]*)?\.tmp$")


def remove_orphaned_temps(folder: Path) -> list[Path]:
    """Temporary files under `folder` whose writer is dead (a build killed mid-write):
    removed. A live writer's (pid alive, or the caller's own) are kept."""
    removed = []
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            m = TEMP_RE.match(name)
            if m is None or int(m.group(1)) == os.getpid() or process_exists(int(m.group(1))):
                continue
            p = Path(dirpath) / name
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def process_exists(pid: int) -> bool:
    """Whether a process of that pid exists (another user's counts: not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True          # another user's process (or a number too big): not ours to judge
    return True


def write_atomic(path: Path | str, data: str | bytes, *, only_if_changed: bool = False) -> bool:
    """Write via a temp file in the same folder + rename. Returns True when bytes changed.
    The file gets the mode open() would give it (0666 less the umask), not mkstemp's 0600,
    so a shared cache's other users can read what SCons copies there."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    if only_if_changed and path.exists() and path.read_bytes() == raw:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_name(path), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def dump_json(obj) -> str:
    """Canonical JSON: sorted keys, stable floats, trailing newline (hashes are stable)."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: Path | str, obj, *, only_if_changed: bool = False) -> bool:
    return write_atomic(path, dump_json(obj), only_if_changed=only_if_changed)


def sha256_bytes(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def sha256_file(path: Path | str) -> str:
    return sha256_bytes(Path(path).read_bytes())


def sha256_or_missing(path: Path | str) -> str:
    """A file's sha256, or "missing" when it cannot be read (an input lock's entry)."""
    try:
        return sha256_file(path)
    except OSError:
        return "missing"


def sha256_json(obj) -> str:
    return sha256_bytes(dump_json(obj).encode())


def read_json(path: Path | str) -> dict | None:
    """A JSON object from a file; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
