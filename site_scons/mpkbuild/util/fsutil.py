"""Atomic, change-only file writes and content hashing.

Every generated or result file goes through :func:`write_atomic`: a killed build leaves
either the old file or the new one, never a torn one that a later run would trust.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path | str, data: str | bytes, *, only_if_changed: bool = False) -> bool:
    """Write via a temp file in the same folder + rename. Returns True when bytes changed."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    if only_if_changed and path.exists() and path.read_bytes() == raw:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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


def sha256_json(obj) -> str:
    return sha256_bytes(dump_json(obj).encode())


def read_json(path: Path | str) -> dict | None:
    """A JSON object from a file; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
