"""Atomic, change-only file writes, content hashing, and planning's reads.

Every generated or result file goes through :func:`write_atomic`: a killed build leaves
either the old file or the new one, never a torn one that a later run would trust.
:class:`ReadOnce` is what one planning run (status, -n, the plan before a build) reads,
each file at most once.
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


def written_mark(result_path: Path | str) -> Path:
    """Where a gate's result keeps the digest of the bytes its gate wrote: a result SCons
    never recorded (the build was killed first) is then told from one edited by hand."""
    result_path = Path(result_path)
    return result_path.with_name(f".{result_path.name}.written")


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
        return json_object(read_bytes(os.fspath(path)))
    except OSError:
        return None


def json_object(raw: bytes) -> dict | None:
    """The JSON object these (UTF-8) bytes hold; None when they are not one."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def repo_rel(text: str) -> str:
    """A repo-relative path, normalised as os.path.relpath(root / text, root) gives it
    ("./a", "a//b", "a/../b", "a/"); the common clean case is returned as it is."""
    if "/." in "/" + text or "//" in f"/{text}/":
        return os.path.normpath(text)
    return text


def read_bytes(path: str) -> bytes:
    """A whole file's bytes (raises OSError): plain os calls, ~2x faster than open().read()
    for the small files planning hashes by the thousand."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def scons_signature(data: bytes) -> str:
    """The content signature SCons records for these bytes (.sconsign's csig)."""
    try:
        import SCons.Util
        return SCons.Util.hash_signature(data)
    except ImportError:          # outside SCons (unit tests): SCons's default, MD5
        return hashlib.md5(data).hexdigest()


class ReadOnce:
    """The files one planning run reads (status, -n, check, the plan before a build), each
    read from disk at most once: its bytes, its parsed JSON, its content signature. Planning
    runs no action, so nothing it reads changes under it; a build's actions never use one.
    Paths are repo-relative. Bytes are kept only for files read whole (bytes/json: the gate
    results), not for files only hashed."""

    def __init__(self, root: Path | str):
        self.root = os.fspath(root)
        self._prefix = os.path.join(self.root, "")
        self._bytes: dict[str, bytes | None] = {}
        self._json: dict[str, dict | None] = {}
        self._sigs: dict[str, str | None] = {}
        self._exists: dict[str, bool] = {}

    def _path(self, rel: str) -> str:
        return rel if rel.startswith(os.sep) else self._prefix + rel       # os.path.join, faster

    def bytes(self, rel: str) -> bytes | None:
        """The file's bytes; None when it is missing or unreadable."""
        try:
            return self._bytes[rel]
        except KeyError:
            try:
                data = read_bytes(self._path(rel))
            except OSError:
                data = None
            self._bytes[rel] = data
            return data

    def json(self, rel: str) -> dict | None:
        """As read_json: a JSON object, None when missing, unreadable or not an object.
        Shared between readers: do not modify it."""
        try:
            return self._json[rel]
        except KeyError:
            data = self.bytes(rel)
            obj = self._json[rel] = json_object(data) if data is not None else None
            return obj

    def signature(self, rel: str) -> str | None:
        """The file's content signature as SCons computes it, None when it is missing or
        unreadable. Always from the bytes: an unchanged mtime and size prove nothing."""
        try:
            return self._sigs[rel]
        except KeyError:
            data = self._bytes.get(rel)
            if data is None and rel not in self._bytes:
                try:
                    data = read_bytes(self._path(rel))
                except OSError:
                    data = None
            sig = self._sigs[rel] = None if data is None else scons_signature(data)
            return sig

    def exists(self, rel: str) -> bool:
        """As os.path.exists (symlinks followed); access(F_OK) skips building a stat result."""
        try:
            return self._exists[rel]
        except KeyError:
            out = self._exists[rel] = os.access(self._path(rel), os.F_OK)
            return out
