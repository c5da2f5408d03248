"""Trees wire cannot take are named for what they are: an older layout as such, a v1 tree asked
for runtime=v2 before anything about deps/ (wiring compiles nothing, so it needs none)."""
from __future__ import annotations

import shutil

import pytest

from conftest import REPO, copy_project
from mpkbuild import wire
from test_wire_helpers import WIRING, fresh_tree, rmsnorm_spec, snapshot

PINNED = REPO.parent / "shared" / "mirage" / "mpk"


def test_an_older_layout_is_named_as_such_and_nothing_is_written(tmp_path):
    tree = fresh_tree(tmp_path)
    new = tree / "python/mirage/mpk/persistent_kernel.py"
    shutil.move(new, tree / "python/mirage/persistent_kernel.py")
    before = snapshot(tree)
    with pytest.raises(wire.TargetMissing) as err:
        wire.plan(tree, [rmsnorm_spec()], WIRING, ["rmsnorm_v2"])
    assert ("not supported: persistent_kernel.py at python/mirage/, expected python/mirage/mpk/"
            in str(err.value)), err.value
    assert snapshot(tree) == before


@pytest.mark.skipif(not PINNED.is_dir(), reason=f"the pinned Mirage tree is not at {PINNED}")
def test_runtime_v2_on_a_v1_tree_without_deps_says_it_is_a_v1_tree(tmp_path):
    tree = tmp_path / "alone" / "mpk"                   # no deps/ in it, beside it or above it
    shutil.copytree(PINNED, tree, symlinks=True)
    project = copy_project(tmp_path / "proj")
    run = project.scons("-n", "stage=wire", "runtime=v2", f"mpk_root={tree}", check=False)
    assert run.returncode == 2
    assert "runtime=v2 needs Runtime-V2, and this checkout has no" in run.stderr, run.stderr
    assert "cutlass" not in run.stderr
