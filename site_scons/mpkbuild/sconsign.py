"""What SCons recorded, read without SCons's node classes: each target's input signatures at
its last successful build (.sconsign.dblite), and whether an output still has the bytes
its build wrote. status, -n and the plan before a build read it; it writes nothing."""
from __future__ import annotations

import os
from pathlib import Path

from mpkbuild.util.fsutil import ReadOnce


class _Record:
    """What status reads of one pickled SCons record (an SConsignEntry, a node's ninfo or
    binfo): its fields as plain attributes. SCons's own classes restore each field with
    setattr from Python (__setstate__); a plain instance gets its fields in one C-level
    dict update, which makes reading a large .sconsign several times faster."""


# the record classes SCons pickles into .sconsign (SCons.SConsign, SCons.Node.*)
_RECORD_CLASSES = ("SConsignEntry", "NodeInfoBase", "BuildInfoBase", "FileNodeInfo",
                   "FileBuildInfo", "DirNodeInfo", "DirBuildInfo", "ValueNodeInfo",
                   "ValueBuildInfo", "AliasNodeInfo", "AliasBuildInfo", "EntryNodeInfo",
                   "EntryBuildInfo")


def _unpickler():
    import pickle

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module.startswith("SCons.") and name in _RECORD_CLASSES:
                return _Record
            return super().find_class(module, name)
    return Unpickler


class Sconsign:
    """Read-only view of what SCons recorded for each target (.sconsign.dblite)."""

    def __init__(self, root: Path):
        self.root = root
        self._db = None
        self._dirs: dict[str, dict] = {}
        path = root / ".sconsign.dblite"
        if path.exists():
            import SCons.dblite          # the format is SCons's own; read it with SCons
            self._db = SCons.dblite.open(str(root / ".sconsign"), "r")
            self._unpickler = _unpickler()

    def entry(self, rel: str):
        if self._db is None:
            return None
        d, _, name = rel.rpartition("/")
        d = d or "."
        if d not in self._dirs:
            import io
            try:
                self._dirs[d] = self._unpickler(io.BytesIO(self._db[d])).load()
            except KeyError:
                self._dirs[d] = {}
        return self._dirs[d].get(name)


def tampered(files: ReadOnce, sconsign: Sconsign, rel: str) -> str | None:
    """Whether a gate result still has the bytes SCons recorded when its action wrote them:
    None when it does (or nothing was recorded); "unrecorded" when it has the bytes its gate
    wrote (the digest record() keeps beside it) but SCons never recorded them (the build
    was killed before it wrote .sconsign); "tampered" otherwise (edited by hand)."""
    entry = sconsign.entry(rel)
    ninfo = getattr(entry, "ninfo", None)
    recorded = getattr(ninfo, "csig", None)
    if not recorded:
        return None
    # hashed every time, never trusted on mtime + size, so a same-size edit with its mtime
    # put back is still caught
    current = files.signature(rel)
    if current is None or current == recorded:
        return None
    from mpkbuild.util.fsutil import sha256_bytes, written_mark
    try:
        mark = written_mark(os.path.join(files.root, rel)).read_text().strip()
    except OSError:
        mark = None
    return "unrecorded" if mark == sha256_bytes(files.bytes(rel)) else "tampered"


def action_signature() -> str | None:
    """The action signature SCons records for every node (site_tools/mpk.py _NodeAction),
    computed as SCons computes it."""
    try:
        import SCons.Util
    except ImportError:
        return None
    from mpkbuild.util.closure import ACTION_VERSION
    return SCons.Util.hash_signature(ACTION_VERSION.encode())
