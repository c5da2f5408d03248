"""Writing a checkout's files so that no kill leaves it half-wired.

Owns :func:`commit` (one run's file writes and deletions for one checkout) and
:func:`recover` (what the next wire, status or -n on that checkout does with a run that
died), and :func:`write_fragments` (build-folder fragments, written only when their bytes
change).

A commit is journaled in the checkout (`.mpk-wire-journal.json`, written atomically) before
the first file is touched:

1. every target is checked for writability (a read-only file or folder refuses the run);
2. the journal is written in phase `staging`, naming every temp file the run will make;
3. the new texts are written to those temp files beside their targets and synced;
4. the journal is rewritten in phase `committed`: from here the run is finished, not undone;
5. the temp files are renamed over their targets, the deletions made, the folders synced;
6. the journal is removed.

A run killed before 4 is rolled back by :func:`recover` (its temp files removed: no target
was touched); one killed after it is rolled forward (each remaining temp file renamed over
its target, each deletion made). Either way the checkout ends as it was or as the run would
have left it, and no temp file of ours stays. The journal also keeps two runs from writing
one checkout at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

from .errors import TargetReadOnly, WireBusy, WireError

JOURNAL = ".mpk-wire-journal.json"
TEMP_SUFFIX = ".wire-tmp"


def _journal_tmp(root: Path, pid: int) -> Path:
    return root / f"{JOURNAL}.{pid}.tmp"


def _writable_mode(p: Path) -> bool:
    """Mode bits first: root ignores them in os.access, but a 0444 file or a 0555 folder
    is a statement."""
    return bool(p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _dir_writable(d: Path) -> bool:
    return d.is_dir() and _writable_mode(d) and os.access(d, os.W_OK | os.X_OK)


def check_writable(root: Path, rels) -> None:
    """Refuse before anything is written if any target, or the folder it is in, is read-only."""
    for rel in rels:
        p = root / rel
        if p.exists():
            ok = _writable_mode(p) and os.access(p, os.W_OK) and _dir_writable(p.parent)
        else:
            ok = _dir_writable(p.parent)
        if not ok:
            raise TargetReadOnly(f"{rel}: cannot write it in {root} (read-only file, or its "
                                 "folder is missing or read-only); fix that, then apply again. "
                                 "Nothing was changed")


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), to tell it from a later one that
    was given the same pid; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(journal: dict) -> bool:
    return _start_time(int(journal.get("pid", -1))) == journal.get("start")


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _sync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_journal(root: Path, journal: dict, exclusive: bool = False) -> None:
    """The journal, atomically (its own temp file, synced, renamed, the folder synced);
    exclusive: only where no journal is (the claim on the checkout)."""
    tmp = _journal_tmp(root, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(journal, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    if exclusive:
        try:
            os.link(tmp, root / JOURNAL)       # fails where a journal is: one writer at a time
        except FileExistsError:
            tmp.unlink(missing_ok=True)
            raise
        tmp.unlink()
    else:
        os.replace(tmp, root / JOURNAL)
    _sync_dir(root)


def read_journal(root: Path) -> dict | None:
    try:
        return json.loads((Path(root) / JOURNAL).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise WireError(f"{Path(root) / JOURNAL}: an unreadable wire journal ({exc}); it was "
                        "not written by a run of this tool as it is: look at it, then remove it "
                        "by hand") from None


def _describe(journal: dict) -> str:
    return (f"`{journal.get('what', 'wire')}` (pid {journal.get('pid')}, started "
            f"{journal.get('started', '?')}, {len(journal.get('entries', []))} files)")


def commit(root: Path, writes: dict[str, str], deletes: list[str], what: str = "wire") -> None:
    """Write/delete files under root as one journaled run (the module docstring); what: the
    run, for the journal (`apply rmsnorm_v2`)."""
    root = Path(root)
    check_writable(root, list(writes) + list(deletes))
    recover(root)                                  # a dead run's leftovers, first
    entries = []
    for rel, text in sorted(writes.items()):
        target = root / rel
        tmp = target.with_name(f".{target.name}.{os.getpid()}{TEMP_SUFFIX}")
        entries.append({"path": rel, "tmp": tmp.relative_to(root).as_posix(),
                        "new": _sha(text.encode("utf-8"))})
    entries += [{"path": rel, "tmp": None, "new": None} for rel in sorted(deletes)]
    journal = {"tool": "mpkbuild wire", "what": what, "pid": os.getpid(),
               "start": _start_time(os.getpid()),
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "phase": "staging",
               "entries": entries}
    try:
        _write_journal(root, journal, exclusive=True)
    except FileExistsError:
        raise WireBusy(f"{root}: another wire run is writing this checkout: "
                       f"{_describe(read_journal(root) or {})}; wait for it. Nothing was "
                       "changed") from None
    try:
        for e in entries:
            if e["tmp"] is None:
                continue
            target, tmp = root / e["path"], root / e["tmp"]
            mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(writes[e["path"]].encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
        for d in {(root / e["path"]).parent for e in entries}:
            _sync_dir(d)
        journal["phase"] = "committed"
        _write_journal(root, journal)
    except BaseException:
        _roll_back(root, journal)                  # an error while staging: undo it now
        raise
    _finish(root, journal)


def _roll_back(root: Path, journal: dict) -> int:
    """Phase staging: no target was touched; remove the run's temp files."""
    removed = 0
    for e in journal.get("entries", []):
        if e.get("tmp") and (root / e["tmp"]).exists():
            (root / e["tmp"]).unlink()
            removed += 1
    (root / JOURNAL).unlink(missing_ok=True)
    _sync_dir(root)
    return removed


def _finish(root: Path, journal: dict) -> int:
    """Phase committed: every rename and deletion not made yet, made."""
    done = 0
    for e in journal["entries"]:
        target = root / e["path"]
        if e["tmp"] is None:
            if target.exists():
                target.unlink()
                done += 1
            continue
        tmp = root / e["tmp"]
        if tmp.exists():
            os.replace(tmp, target)
            done += 1
        elif not target.is_file() or _sha(target.read_bytes()) != e["new"]:
            raise WireError(f"{root}: the interrupted wire run {_describe(journal)} cannot be "
                            f"finished: {e['path']} is neither its new text nor beside its "
                            f"staged copy (changed since?); the journal {JOURNAL} is left for you "
                            "to look at")
    for d in {(root / e["path"]).parent for e in journal["entries"]}:
        _sync_dir(d)
    (root / JOURNAL).unlink()
    _sync_dir(root)
    return done


def recover(root: Path) -> str | None:
    """A wire run on this checkout that died (its journal left, its writer gone): rolled
    back or finished; returns what was done, for the user, or None when there was none.
    A live writer's run is left alone (and named)."""
    root = Path(root)
    for tmp in root.glob(f"{JOURNAL}.*.tmp"):      # a journal being written when its writer
        pid = tmp.name[len(JOURNAL) + 1:-4]        # died (no temp file is made before it)
        if pid.isdigit() and int(pid) != os.getpid() and _start_time(int(pid)) is None:
            tmp.unlink(missing_ok=True)
    journal = read_journal(root)
    if journal is None:
        return None
    if _alive(journal) and journal.get("pid") != os.getpid():
        return f"a wire run is writing {root} now: {_describe(journal)}"
    if journal.get("phase") == "committed":
        done = _finish(root, journal)
        return (f"finished the interrupted wire run {_describe(journal)} on {root}: "
                f"{done} file(s) were still to be renamed or removed; the checkout is as that "
                "run leaves it")
    removed = _roll_back(root, journal)
    return (f"rolled back the interrupted wire run {_describe(journal)} on {root}: it had "
            f"touched no file; {removed} temp file(s) removed; the checkout is as it was")


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
