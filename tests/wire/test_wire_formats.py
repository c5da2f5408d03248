"""The wire stage on checkouts formatted differently from the pinned ones (issue 41): the
`} else {` layout, code at other indents, a checkout without TaskMetadata::task_offset, a
tree reformatted by its owner in another clang-format style, and an upstream entry added at
a wired kernel's number. Each variation is made from the fixture MPK tree (written from the
facts), and each wired tree must still build and dispatch."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from mpkbuild import wire
from test_wire_helpers import (WIRING, build_driver, fresh_tree, rmsnorm_spec, run_driver,
                               silu_spec, snapshot)

KERNELS = ["rmsnorm_v2", "silu_mul_v1"]
RMS_T = ["1x4096:8x4096", "4096:4096", "1x4096:8x4096"]
GRAPH = "src/kernel/graph.cc"
RUNTIME = "src/kernel/runtime.cc"
HEADER = "include/mirage/persistent_kernel/runtime_header.h"
# clang-format from the environment the tests run in (the venv's, pip install -e .[test])
CLANG_FORMAT = shutil.which("clang-format", path=os.pathsep.join(
    [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def specs():
    return [rmsnorm_spec(), silu_spec()]


def plan(root, **kw):
    return wire.plan(root, specs(), WIRING, KERNELS, **kw)


def edit(root, rel, fn):
    p = root / rel
    p.write_text(fn(p.read_text()))


def joined_else(text: str) -> str:
    """graph.cc in the ordinary clang-format layout: `} else if (...) {`, `} else {`."""
    text = re.sub(r"\n[ \t]*// (Hopper|SM100) tasks\n", "\n", text)
    return re.sub(r"\}\n[ \t]*else", "} else", text)


def dispatches(root) -> list[str]:
    res = run_driver(build_driver(root), "rmsnorm_v2_hopper", *RMS_T, "+", "rmsnorm_v2_sm100", *RMS_T)
    assert res.returncode == 0, res.stderr
    return [ln for ln in res.stdout.splitlines() if ln.startswith("dispatch")]


def test_the_closing_brace_else_layout_is_wired_compiles_and_unwires(tmp_path):
    root = fresh_tree(tmp_path)
    edit(root, GRAPH, joined_else)
    assert "  } else {\n" in (root / GRAPH).read_text() and "\n  else {" not in (root / GRAPH).read_text()
    before = snapshot(root)
    p = plan(root)
    wire.apply(p)
    text = (root / GRAPH).read_text()
    # our branch opens with the `}` that closed the one before, and `} else {` closes ours
    assert re.search(r'\n  \} else if \(name == "rmsnorm_v2_hopper"\) \{\n', text)
    assert "} else {\n    printf" in text
    assert dispatches(root)[0].startswith("dispatch rmsnorm_v2_hopper -> TASK_RMSNORM_V2_HOPPER(153)")
    assert plan(root).empty                                   # apply twice: identical
    wire.unwire(root, KERNELS, WIRING)
    (root / "driver_bin").unlink()
    assert snapshot(root) == before


def test_blocks_take_the_indent_of_the_code_around_them(tmp_path):
    root = fresh_tree(tmp_path)
    # the task loop two columns further in (12 on one branch of the real tree, 10 on another)
    edit(root, RUNTIME, lambda t: t.replace("  // Initialize input tensors", "    // Initialize input tensors"))
    wire.apply(plan(root))
    lines = (root / RUNTIME).read_text().splitlines()
    block = [ln for ln in lines if "task_offset = bid.x" in ln and "rmsnorm" not in ln.lower()]
    begin = next(ln for ln in lines if ">>>mpk-wire:rmsnorm_v2/sm_90a/task_offset:" in ln)
    anchor = next(ln for ln in lines if "// Initialize input tensors" in ln)
    indent = len(anchor) - len(anchor.lstrip())
    assert indent == 4 and len(begin) - len(begin.lstrip()) == indent
    opening = next(ln for ln in lines if "if (task_type == TASK_RMSNORM_V2_HOPPER)" in ln)
    assert len(opening) - len(opening.lstrip()) == indent
    assert block, "the wired task_offset line"
    assert dispatches(root)[0].endswith("task_offset=5 tma=0")


def test_a_checkout_without_task_offset_is_not_supported_and_nothing_is_written(tmp_path):
    root = fresh_tree(tmp_path)
    edit(root, HEADER, lambda t: t.replace("  int task_offset = 0;\n", ""))
    before = snapshot(root)
    with pytest.raises(wire.Unsupported) as err:
        plan(root)
    msg = str(err.value)
    assert "not supported on this checkout" in msg and "TaskMetadata has no `int task_offset`" in msg
    assert snapshot(root) == before


@pytest.mark.skipif(CLANG_FORMAT is None, reason="clang-format (pip install -e .[test]) not found")
def test_a_tree_reformatted_in_another_style_stays_ours_and_unwires(tmp_path):
    root = fresh_tree(tmp_path)
    p = plan(root)
    wire.apply(p)
    cpp = [r for r in p.changes if r.endswith((".h", ".cc", ".cuh"))]
    style = "{BasedOnStyle: LLVM, ColumnLimit: 100, IndentWidth: 4}"
    subprocess.run([CLANG_FORMAT, f"-style={style}", "-i", *cpp], cwd=root, check=True)
    text = (root / GRAPH).read_text()
    # our blocks were reformatted with the rest: 4-wide indents, one line up to 100 columns
    assert ("        int variant_id = task_register->register_rmsnorm_v2_hopper_task(customized->bgraph, "
            "params);\n") in text
    reformatted = snapshot(root)
    # every block is still ours: planning again changes nothing, whatever the layout
    assert plan(root).empty
    assert snapshot(root) == reformatted
    # a real hand edit, in the reformatted tree, is still one
    edit(root, GRAPH, lambda t: t.replace("TASK_RMSNORM_V2_HOPPER, variant_id", "TASK_RMSNORM_V2_HOPPER, 7", 1))
    with pytest.raises(wire.DriftError):
        wire.unwire(root, KERNELS, WIRING)
    edit(root, GRAPH, lambda t: t.replace("TASK_RMSNORM_V2_HOPPER, 7", "TASK_RMSNORM_V2_HOPPER, variant_id", 1))
    wire.unwire(root, KERNELS, WIRING)
    after = (root / GRAPH).read_text()
    assert "mpk-wire" not in after and "rmsnorm_v2" not in after
    assert dispatches_upstream(root)


def dispatches_upstream(root) -> bool:
    res = run_driver(build_driver(root), "rmsnorm_hopper", *RMS_T)
    return res.returncode == 0 and "TASK_RMS_NORM_HOPPER(152)" in res.stdout


def test_an_upstream_entry_at_a_wired_number_is_a_clash_never_a_silent_renumber(tmp_path):
    root = fresh_tree(tmp_path)
    wire.apply(plan(root))
    # the owner adds their own task at rmsnorm_v2's Hopper number, outside our blocks
    edit(root, HEADER, lambda t: t.replace("  TASK_HOPPER_TASK_END", "  TASK_OWNERS_OWN = 153,\n  TASK_HOPPER_TASK_END", 1))
    before = snapshot(root)
    with pytest.raises(wire.NumberClash) as err:
        plan(root)
    msg = str(err.value)
    assert "153" in msg and "TASK_RMSNORM_V2_HOPPER" in msg and "TASK_OWNERS_OWN" in msg and "renumber=1" in msg
    assert snapshot(root) == before
    moved = plan(root, renumber=True)
    assert moved.numbers["rmsnorm_v2"]["sm_90a"] != 153


def test_blocks_with_the_older_spaced_markers_are_still_ours(tmp_path):
    """Markers are one word after the comment leader now (a formatter cannot wrap them); a
    checkout wired with the older `>>> mpk-wire <key> sha=<sha>` markers still plans
    nothing to change, and unwires to its pristine bytes."""
    root = fresh_tree(tmp_path)
    pristine = snapshot(root)
    wire.apply(plan(root))
    wired = snapshot(root)
    for rel in wired:
        path = root / rel
        text = path.read_text()
        old = re.sub(r">>>mpk-wire:([\w./-]+):sha=([0-9a-f]+)", r">>> mpk-wire \1 sha=\2", text)
        old = re.sub(r"<<<mpk-wire:([\w./-]+)", r"<<< mpk-wire \1", old)
        if old != text:
            path.write_text(old)
    older = snapshot(root)
    assert older != wired
    assert plan(root).empty                                  # kept as they are
    wire.apply(wire.plan_unwire(root, KERNELS, WIRING))
    assert snapshot(root) == pristine
