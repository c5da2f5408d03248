"""What wire writes passes the tree's own format check, in the tree's own style.

The pinned mpk tree in three styles: its own .clang-format, LLVM at 100 columns, and Google
at 120 columns with 4-space indents (each tree first reformatted whole in its style, so
upstream is clean): every catalog kernel applied, then `clang-format --dry-run -Werror` over
every C++ file the run touched finds nothing, a second apply changes nothing, and unwire
gives the tree back byte for byte. Without clang-format the blocks keep the shipped style and
the plan says so."""
from __future__ import annotations

import subprocess

import pytest

from mpkbuild import wire
from mpkbuild.wire import style
from test_wire_helpers import WIRING, snapshot
from test_wire_real import MIRAGE, catalog, copy_tree

PINNED = MIRAGE / "mpk"
CLANG_FORMAT = style.clang_format()
STYLES = {"own": None,
          "llvm-100": "BasedOnStyle: LLVM\nColumnLimit: 100\n",
          "google-120-4": "BasedOnStyle: Google\nColumnLimit: 120\nIndentWidth: 4\n"}

pytestmark = [pytest.mark.skipif(not PINNED.is_dir(), reason=f"the pinned Mirage tree is not at {PINNED}"),
              pytest.mark.skipif(CLANG_FORMAT is None, reason="clang-format (pip install -e .[test]) not found")]


@pytest.fixture(scope="module")
def wired():
    """(names, specs, sources) of every catalog kernel with a wiring section."""
    specs, sources = catalog()
    return [s["kernel"] for s in specs], specs, sources


def styled_tree(tmp_path, name: str, names, specs, sources):
    root = copy_tree("mpk", tmp_path / name)
    if STYLES[name] is not None:
        (root / ".clang-format").write_text(STYLES[name])
    first = wire.plan(root, specs, WIRING, names, sources=sources)
    cpp = [r for r, c in first.changes.items() if c.old is not None and r.endswith(style.CPP_SUFFIXES)]
    subprocess.run([CLANG_FORMAT, "-i", "--style=file", *cpp], cwd=root, check=True)
    return root, cpp


@pytest.mark.parametrize("name", list(STYLES))
def test_blocks_pass_the_trees_own_format_check_and_unwire_exactly(wired, tmp_path, name):
    names, specs, sources = wired
    root, cpp = styled_tree(tmp_path, name, names, specs, sources)
    pristine = snapshot(root)
    check = subprocess.run([CLANG_FORMAT, "--dry-run", "-Werror", "--style=file", *cpp], cwd=root,
                           capture_output=True, text=True)
    assert check.returncode == 0, f"upstream is not clean in {name}: {check.stderr[:2000]}"
    p = wire.plan(root, specs, WIRING, names, sources=sources)
    wire.apply(p)
    touched = [r for r in p.changes if r.endswith(style.CPP_SUFFIXES)]
    check = subprocess.run([CLANG_FORMAT, "--dry-run", "-Werror", "--style=file", *touched], cwd=root,
                           capture_output=True, text=True)
    assert check.returncode == 0, f"{name}: the format check fails the wired tree:\n{check.stderr[:3000]}"
    wired = snapshot(root)
    assert wire.plan(root, specs, WIRING, names, sources=sources).empty
    assert snapshot(root) == wired
    wire.unwire(root, names, WIRING)
    assert snapshot(root) == pristine


def test_without_clang_format_the_shipped_style_stays_and_the_plan_says_so(wired, tmp_path, monkeypatch):
    names, specs, sources = wired
    root = copy_tree("mpk", tmp_path)
    (root / ".clang-format").write_text(STYLES["google-120-4"])
    monkeypatch.setattr(style, "clang_format", lambda: None)
    p = wire.plan(root, specs, WIRING, names, sources=sources)
    assert any(n.startswith("clang-format not found") for n in p.notes), p.notes
