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


def test_a_kernel_that_reads_no_task_index_wires_into_a_tree_without_task_offset(tmp_path):
    """A public branch's TaskMetadata may have no task_offset: a tile-indexed kernel (whose
    body gets its task index from it) is 'not supported' there, naming the field, and writes
    nothing; one that is not (wiring.tile_indexed: false) gets 0 for its index and wires."""
    from test_wire_helpers import silu_spec
    tree = fresh_tree(tmp_path)
    header = tree / "include/mirage/persistent_kernel/runtime_header.h"
    header.write_text(header.read_text().replace("  int task_offset = 0;\n", ""))
    before = snapshot(tree)
    with pytest.raises(wire.Unsupported, match="task_offset"):
        wire.apply(wire.plan(tree, [rmsnorm_spec()], WIRING, ["rmsnorm_v2"]))
    assert snapshot(tree) == before
    spec = silu_spec()
    assert spec["wiring"]["tile_indexed"] is False
    p = wire.plan(tree, [spec], WIRING, ["silu_mul_v1"])
    wire.apply(p)
    register = (tree / "src/kernel/task_register.cc").read_text()
    call = register[register.index('silu_mul_v1_task<$, $>('):]
    assert call.index('code.e("    0,");') < call.index("silu_mul_v1_spec::task_smem()")
    assert not any("task_offset" in text for text in p.fragments["silu_mul_v1"].values())
    wire.unwire(tree, ["silu_mul_v1"], WIRING)
    assert snapshot(tree) == before
