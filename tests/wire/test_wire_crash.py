"""A wire run killed at any instant leaves the checkout as it was or as the run would leave
it, once the next run (or status) has looked at it, and no temp file of ours behind.

The corpus: `kernel=all` applied to the pinned mpk tree (every catalog kernel: 40 files) and
unwired again, each run SIGKILLed in a forked child at every rename, before the first (the
temp files staged, the journal not yet committed), while the temp files are being written,
and after the last rename (the journal not yet removed); then recover(), as the next wire,
status or -n does, and the whole tree compared byte for byte."""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_project
from mpkbuild.util import config
from mpkbuild.wire import fsio, patch
from test_wire_real import MIRAGE, catalog, copy_tree

pytestmark = pytest.mark.skipif(not (MIRAGE / "mpk").is_dir(),
                                reason=f"the pinned Mirage tree is not at {MIRAGE / 'mpk'}")


def digest(tree: Path) -> dict[str, str]:
    return {p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


def fresh_copy(src: Path, dst: Path) -> Path:
    """A copy of one of the module's (writable) trees, replacing the last one."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def ours_left(tree: Path) -> list[str]:
    return sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")
                  if p.name.endswith(fsio.TEMP_SUFFIX) or p.name.startswith(fsio.JOURNAL))


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """The pristine copy, the same copy wired with every catalog kernel, and the two plans."""
    base = tmp_path_factory.mktemp("crash")
    pristine = copy_tree("mpk", base)
    specs, sources = catalog()
    names = [s["kernel"] for s in specs]
    wire_plan = patch.plan(pristine, specs, config.SHIPPED_WIRING, names, sources=sources)
    assert not wire_plan.problems
    applied = fresh_copy(pristine, base / "applied")
    patch.apply(patch.plan(applied, specs, config.SHIPPED_WIRING, names, sources=sources))
    unwire_plan = patch.plan_unwire(applied, names, config.SHIPPED_WIRING)
    return {"base": base, "pristine": pristine, "applied": applied, "plan": wire_plan,
            "unwire": unwire_plan, "names": names,
            "digests": {"pristine": digest(pristine), "applied": digest(applied)}}


def killed_run(tree: Path, plan, kill) -> None:
    """Apply `plan` (made for a tree with these bytes) to `tree` in a forked child that
    SIGKILLs itself where kill(event, count) says: event is 'rename' (an os.replace of fsio's,
    the journal's commit first), 'stage' (a temp file opened) or 'done' (the journal about
    to be removed)."""
    plan.mpk_root = tree
    pid = os.fork()
    if pid == 0:
        try:
            counts = {"rename": 0, "stage": 0}
            real_replace, real_open, real_unlink = os.replace, os.open, Path.unlink

            def replace(src, dst):
                if kill("rename", counts["rename"]):
                    os.kill(os.getpid(), signal.SIGKILL)
                counts["rename"] += 1
                return real_replace(src, dst)

            def open_(path, flags, mode=0o777, **kw):
                if str(path).endswith(fsio.TEMP_SUFFIX):
                    if kill("stage", counts["stage"]):
                        os.kill(os.getpid(), signal.SIGKILL)
                    counts["stage"] += 1
                return real_open(path, flags, mode, **kw)

            def unlink(self, missing_ok=False):
                if self.name == fsio.JOURNAL and kill("done", 0):
                    os.kill(os.getpid(), signal.SIGKILL)
                return real_unlink(self, missing_ok=missing_ok)

            fsio.os.replace, fsio.os.open, fsio.Path.unlink = replace, open_, unlink
            patch.apply(plan)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
        f"the run was not killed where asked (status {status})"


def kill_points(n_files: int) -> list[tuple[str, object]]:
    """(name, kill) for every instant of the corpus; rename 0 is the journal's commit, so
    'before the first' is before it, and rename i (1..n) the i-th file's."""
    points = [("while staging the 2nd temp file", lambda e, c: e == "stage" and c == 1),
              ("staged, before the first rename", lambda e, c: e == "rename" and c == 0)]
    points += [(f"before rename {i} of {n_files}", lambda e, c, i=i: e == "rename" and c == i)
               for i in range(1, n_files + 1)]
    points.append(("after the last rename", lambda e, c: e == "done"))
    return points


@pytest.mark.parametrize("run", ["apply", "unwire"])
def test_a_kill_at_any_instant_ends_byte_exact(trees, run, tmp_path):
    plan = trees["plan"] if run == "apply" else trees["unwire"]
    start, end = ("pristine", "applied") if run == "apply" else ("applied", "pristine")
    writes = sum(1 for c in plan.changes.values() if c.new is not None)
    assert run == "unwire" or len(plan.changes) >= 40, len(plan.changes)
    outcomes = {}
    for name, kill in kill_points(writes):
        tree = fresh_copy(trees[start], tmp_path / "tree")
        killed_run(tree, plan, kill)
        assert ours_left(tree), f"{name}: the kill left no journal behind: it came too late"
        said = fsio.recover(tree)
        assert said and ("rolled back" in said or "finished" in said), (name, said)
        assert ours_left(tree) == [], (name, ours_left(tree))
        now = digest(tree)
        state = next((s for s in ("pristine", "applied") if now == trees["digests"][s]), None)
        assert state is not None, f"{name}: the checkout is neither as it was nor as the run leaves it"
        outcomes[name] = state
        assert fsio.recover(tree) is None                  # once looked at, nothing is left
    assert outcomes["while staging the 2nd temp file"] == start
    assert outcomes["staged, before the first rename"] == start
    assert all(outcomes[n] == end for n in outcomes if n.startswith(("before rename", "after")))


def test_the_next_run_names_an_unfinished_run_and_finishes_it(trees, tmp_path):
    """Through scons: `-n` on a checkout a killed apply left says what it found and did."""
    tree = fresh_copy(trees["pristine"], tmp_path / "mpk")
    killed_run(tree, trees["plan"], lambda e, c: e == "rename" and c == 5)
    assert any(p.endswith(fsio.TEMP_SUFFIX) for p in ours_left(tree))
    project = copy_project(tmp_path / "proj", kernels=None)
    run = project.scons("-n", "kernel=all", "stage=wire", f"mpk_root={tree}")
    assert "finished the interrupted wire run `apply " in run.stdout + run.stderr, run.stdout + run.stderr
    assert ours_left(tree) == [] and digest(tree) == trees["digests"]["applied"]


def test_a_live_run_is_left_alone_and_a_second_writer_is_refused(trees, tmp_path):
    """The journal of a writer that is alive is neither finished nor undone, and a second
    apply on that checkout refuses, changing nothing."""
    import json
    import time
    tree = fresh_copy(trees["pristine"], tmp_path / "mpk")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while fsio._start_time(sleeper.pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        journal = {"tool": "mpkbuild wire", "what": "apply x", "pid": sleeper.pid,
                   "start": fsio._start_time(sleeper.pid), "phase": "staging", "entries": []}
        (tree / fsio.JOURNAL).write_text(json.dumps(journal))
        before = digest(tree)
        assert "a wire run is writing" in fsio.recover(tree)
        plan = trees["plan"]
        plan.mpk_root = tree
        with pytest.raises(patch.WireError, match="another wire run is writing this checkout"):
            patch.apply(plan)
        assert digest(tree) == before
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "rolled back" in fsio.recover(tree)              # its writer is gone now
    assert ours_left(tree) == []


def test_a_read_only_folder_is_refused_before_anything_is_written(trees, tmp_path):
    """As root too: a 0555 folder that would get a new file stops the run, nothing written."""
    tree = fresh_copy(trees["pristine"], tmp_path / "mpk")
    plan = trees["plan"]
    plan.mpk_root = tree
    new_files = [rel for rel, c in plan.changes.items() if c.old is None]
    assert new_files
    folder = (tree / new_files[0]).parent
    before = digest(tree)
    folder.chmod(0o555)
    try:
        with pytest.raises(patch.WireError, match="read-only"):
            patch.apply(plan)
    finally:
        folder.chmod(0o755)
    assert digest(tree) == before and ours_left(tree) == []
