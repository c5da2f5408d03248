"""Wire rmsnorm_v2 and silu_mul_v1 into a copy of the fixture MPK tree: compile, dispatch,
import, apply twice, re-apply after a spec edit, refuse drift, unwire to the original bytes."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from mpkbuild import wire
from test_wire_helpers import (coherence, WIRING, build_driver, fresh_tree, rmsnorm_spec, run_driver,
                               run_python, silu_spec, snapshot)

KERNELS = ["rmsnorm_v2", "silu_mul_v1"]
RMS_T = ["1x4096:8x4096", "4096:4096", "1x4096:8x4096"]
SILU_T = ["1x2048:8x2048", "1x2048:8x2048", "1x2048:8x2048", "--", "0"]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture
def tree(tmp_path):
    return fresh_tree(tmp_path)


def wire_both(root, specs=None):
    p = wire.plan(root, specs or [rmsnorm_spec(), silu_spec()], WIRING, KERNELS)
    wire.apply(p)
    return p


def test_wired_tree_compiles_and_dispatches(tree):
    p = wire_both(tree)
    assert p.numbers == {"rmsnorm_v2": {"sm_90a": 153, "sm_100a": 258},
                         "silu_mul_v1": {"sm_90a": 160, "sm_100a": 257}}
    exe = build_driver(tree)
    res = run_driver(exe, "rmsnorm_v2_hopper", *RMS_T, "+", "rmsnorm_v2_sm100", *RMS_T,
                     "+", "silu_mul_v1_hopper", *SILU_T, "+", "silu_mul_v1_sm100", *SILU_T,
                     "+", "rmsnorm_v2_hopper", *RMS_T,
                     "+", "rmsnorm_v2_hopper", "1x7168:8x7168", "7168:7168", "1x7168:8x7168",
                     "+", "rmsnorm_v2_hopper", "4x7168:16x7168", "7168:7168", "4x7168:16x7168")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("dispatch")]
    assert lines == [
        "dispatch rmsnorm_v2_hopper -> TASK_RMSNORM_V2_HOPPER(153) inputs=2 outputs=1 variant=0 task_offset=5 tma=0",
        "dispatch rmsnorm_v2_sm100 -> TASK_RMSNORM_V2_SM100(258) inputs=2 outputs=1 variant=0 task_offset=5",
        "dispatch silu_mul_v1_hopper -> TASK_SILU_MUL_V1_HOPPER(160) inputs=2 outputs=1 variant=0 task_offset=0 tma=0",
        # 257 lies outside SM100's TMA sub-range: no tma.cuh case is needed or printed
        "dispatch silu_mul_v1_sm100 -> TASK_SILU_MUL_V1_SM100(257) inputs=2 outputs=1 variant=0 task_offset=0",
        # identical code shares a variant; another hidden size is a new variant
        "dispatch rmsnorm_v2_hopper -> TASK_RMSNORM_V2_HOPPER(153) inputs=2 outputs=1 variant=0 task_offset=5 tma=0",
        "dispatch rmsnorm_v2_hopper -> TASK_RMSNORM_V2_HOPPER(153) inputs=2 outputs=1 variant=1 task_offset=5 tma=0",
        # four rows a task (the layer's grid made the output tile 4 rows): a variant of its own
        "dispatch rmsnorm_v2_hopper -> TASK_RMSNORM_V2_HOPPER(153) inputs=2 outputs=1 variant=2 task_offset=5 tma=0",
    ]
    code = [ln[6:] for ln in res.stdout.splitlines() if ln.startswith("code| ")]
    # the body runs on its spec's threads of the worker block, with MPK's own pointers and
    # the SMEM base by MPK's convention (the stand-in CodeKeeper does not indent)
    assert code[:8] == [
        "  if (threadIdx.x < kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::THREADS) {",
        "  kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_task<4096, 1>(",  # rpt: the rows of the task's output tile
        "      static_cast<__nv_bfloat16 const *>(task_desc->input_ptrs[0]),",
        "      static_cast<__nv_bfloat16 const *>(task_desc->input_ptrs[1]),",
        "      static_cast<__nv_bfloat16 *>(task_desc->output_ptrs[0]),",
        "      task_desc->task_metadata.task_offset,",
        "      kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_spec::task_smem());",
        "  }",
    ]
    assert "  kernel::mpkbuild_silu_mul_v1::silu_mul_v1_task<2048, 0>(" in code
    assert "  kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_task<7168, 1>(" in code
    assert "  kernel::mpkbuild_rmsnorm_v2::rmsnorm_v2_task<7168, 4>(" in code
    # the existing tasks still dispatch
    res = run_driver(exe, "rmsnorm_hopper", *RMS_T)
    assert "TASK_RMS_NORM_HOPPER(152)" in res.stdout
    assert coherence(tree) == []


def test_wired_python_layers_run_with_standins(tree):
    wire_both(tree)
    res = run_python(tree, """
import json, mirage as mi
from mirage.mpk.persistent_kernel import PersistentKernel
out = {}
for cc in (90, 100):
    mpk = PersistentKernel(target_cc=cc, test_mode=True)
    t = lambda n, d: mpk.new_tensor(dims=d, dtype=mi.bfloat16, name=n, io_category="cuda_tensor")
    mpk.rmsnorm_v2_layer(input=t("x", (8, 4096)), weight=t("w", (4096,)), output=t("y", (8, 4096)),
                         grid_dim=(8, 1, 1), block_dim=(128, 1, 1))
    mpk.silu_mul_layer(gate=t("g", (8, 2048)), up=t("u", (8, 2048)), out=t("o", (8, 2048)),
                       act_kind=3, grid_dim=(8, 1, 1), block_dim=(128, 1, 1))
    mpk.compile()
    out[cc] = mpk.run_test_mode()
print(json.dumps(out))
""")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [t["name"] for t in out["90"]] == ["rmsnorm_v2_hopper", "silu_mul_v1_hopper"]
    assert [t["name"] for t in out["100"]] == ["rmsnorm_v2_sm100", "silu_mul_v1_sm100"]
    rms, silu = out["90"]
    assert rms["tensors"] == [["x", [0, -1, -1]], ["w", [-1, -1, -1]], ["y", [0, -1, -1]]]
    assert rms["params"] == [] and silu["params"] == [3]
    # the rendered test-mode tests pass against the stand-ins too
    res = run_python(tree, "", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "tests/runtime_python/test_mode")
    assert res.returncode == 0, res.stdout + res.stderr
    # the generated tests are written against the real Python API: against the stand-ins
    # they import and are collected, and skip (no MPKBUILD_ROOT / GPU here)
    assert "2 skipped" in res.stdout, res.stdout
    res = run_python(tree, "import sys; sys.path.insert(0, 'tests/runtime_python/test_mode'); "
                           "import rmsnorm_layer_check as c; c.test_rmsnorm_layer()")
    assert res.returncode == 0, res.stderr      # the checkout's own layer still works


def test_apply_twice_is_byte_identical(tree):
    wire_both(tree)
    first = snapshot(tree)
    p = wire.plan(tree, [rmsnorm_spec(), silu_spec()], WIRING, KERNELS)
    assert p.empty and p.diff() == ""
    wire.apply(p)
    assert snapshot(tree) == first


def test_unwire_restores_every_file(tree):
    before = snapshot(tree)
    wire_both(tree)
    assert snapshot(tree) != before
    wire.unwire(tree, ["silu_mul_v1"], WIRING)
    assert not any(b"silu_mul_v1" in v for v in snapshot(tree).values())
    wire.unwire(tree, ["rmsnorm_v2"], WIRING)
    assert snapshot(tree) == before


def test_spec_edit_replaces_only_marked_blocks(tree):
    wire_both(tree)
    before = snapshot(tree)
    spec = rmsnorm_spec()
    # drops the runtime.cc task_offset blocks, and the call passes 0 for the task index
    spec["wiring"]["tile_indexed"] = False
    p = wire.plan(tree, [spec, silu_spec()], WIRING, ["rmsnorm_v2"])
    assert set(p.changes) == {"src/kernel/runtime.cc", "src/kernel/task_register.cc"}
    assert p.numbers["rmsnorm_v2"] == {"sm_90a": 153, "sm_100a": 258}   # numbers kept
    wire.apply(p)
    after = snapshot(tree)
    for rel, old in before.items():
        if rel not in p.changes:
            assert after[rel] == old, rel
    # outside the marked blocks every changed file is untouched
    rx = re.compile(rb"^[ \t]*// >>>mpk-wire:([^:\s]+).*?^[ \t]*// <<<mpk-wire:\1\n", re.M | re.S)
    for rel in p.changes:
        assert rx.sub(b"", after[rel]) == rx.sub(b"", before[rel]), rel
    assert b"task_offset = bid.x;  // " not in after["src/kernel/runtime.cc"]
    assert b"TASK_RMSNORM_V2_HOPPER) {" not in after["src/kernel/runtime.cc"]


def test_hand_edit_is_drift_refused_with_diff(tree):
    wire_both(tree)
    rel = "src/kernel/graph.cc"
    path = tree / rel
    path.write_text(path.read_text().replace(
        "(2, 1, TASK_RMSNORM_V2_HOPPER, variant_id);", "(2, 1, TASK_RMSNORM_V2_HOPPER, 7);"))
    before = snapshot(tree)
    spec = rmsnorm_spec()
    spec["wiring"]["tile_indexed"] = False           # a real change elsewhere too
    with pytest.raises(wire.DriftError) as err:
        wire.plan(tree, [spec, silu_spec()], WIRING, KERNELS)
    msg = str(err.value)
    assert "src/kernel/graph.cc" in msg and "rmsnorm_v2/sm_90a/graph_branch" in msg
    assert "-    task_config[op] = std::make_tuple(2, 1, TASK_RMSNORM_V2_HOPPER, 7);" in err.value.diff
    assert "+    task_config[op] = std::make_tuple(2, 1, TASK_RMSNORM_V2_HOPPER, variant_id);" in err.value.diff
    with pytest.raises(wire.DriftError):
        wire.unwire(tree, ["rmsnorm_v2"], WIRING)
    assert snapshot(tree) == before                  # nothing changed


def test_plan_writes_nothing_and_fragments_are_stable(tree, tmp_path):
    before = snapshot(tree)
    p = wire.plan(tree, [rmsnorm_spec(), silu_spec()], WIRING, KERNELS)
    assert snapshot(tree) == before
    assert "+  TASK_RMSNORM_V2_HOPPER = 153," in p.diff()
    out = tmp_path / "build" / "rmsnorm_v2" / "wiring"
    frags = p.fragments["rmsnorm_v2"]
    assert wire.write_fragments(out, frags) == sorted(frags)
    assert wire.write_fragments(out, frags) == []    # unchanged: nothing rewritten
    assert (out / "enum.sm_90a.h").read_text() == "  TASK_RMSNORM_V2_HOPPER = 153,\n"
    fewer = {k: v for k, v in frags.items() if "sm_100a" not in k}
    assert wire.write_fragments(out, fewer) == sorted(set(frags) - set(fewer))
    assert not any("sm_100a" in p.name for p in out.iterdir())


def test_apply_is_all_or_nothing(tree, monkeypatch):
    before = snapshot(tree)
    p = wire.plan(tree, [rmsnorm_spec(), silu_spec()], WIRING, KERNELS)
    # a read-only target: refused before anything is written
    ro = tree / "src" / "kernel" / "graph.cc"
    ro.chmod(0o444)
    with pytest.raises(wire.TargetReadOnly, match="src/kernel/graph.cc"):
        wire.apply(p)
    assert snapshot(tree) == before
    ro.chmod(0o644)
    # a failure while staging temp files: no target changed, no temp file left behind
    import mpkbuild.wire.fsio as fsio
    real, calls = fsio.os.fsync, []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fsio.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        wire.apply(p)
    assert snapshot(tree) == before
    # a file changed after planning: the plan is stale
    monkeypatch.undo()
    (tree / "src" / "kernel" / "runtime.cc").write_text("// changed\n" + before["src/kernel/runtime.cc"].decode())
    with pytest.raises(wire.StalePlan, match="runtime.cc"):
        wire.apply(p)
