"""Issue 59 item 2: the worker the runtime gate measures in is a declared input. By default
it holds the tasks the checkout's qwen3 builder registers for a decode step on Hopper
(compiled in, never run), ours in place of the task of our op; `runtime.composition:
minimal` leaves only the graphs' own tasks; the declaration is part of the runtime nodes'
key and of every verdict."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from conftest import REPO
PINNED = REPO.parent / "shared" / "mirage" / "mpk"
sys.path.insert(0, str(REPO / "site_scons"))

from mpkbuild.stages import load_kernel  # noqa: E402
from mpkbuild.stages.runtime import composition, megakernel as runtime  # noqa: E402
from mpkbuild.util import config  # noqa: E402

needs_tree = pytest.mark.skipif(not (PINNED / "include").is_dir(),
                                reason="../shared/mirage (the pinned MPK tree) is absent")


def _plan(data: dict, companions: dict | None = None) -> dict:
    return runtime.plan(data, config.wiring_roots(REPO), companions or {}, PINNED)


def _fillers(p: dict) -> dict[str, list[str]]:
    return {d["variant"]: d["call"] for d in p["dispatch"] if d.get("filler")}


@needs_tree
def test_the_worker_holds_the_qwen3_decode_tasks_with_ours_in_place_of_its_op():
    """rmsnorm_v2's megakernel holds Qwen3-8B's attention, its residual linears (o_proj,
    down_proj), the three plain linears and the rest at batch 8, as the checkout's register
    functions emit them; no rmsnorm of the model's (ours replaces it: the one rmsnorm_hopper
    call is the head to head's incumbent), and no graph runs a production task."""
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    p = _plan(k.spec.data)
    calls = _fillers(p)
    assert set(calls) == {"qwen3 embed_tokens", "qwen3 qkv_proj", "qwen3 attention", "qwen3 o_proj",
                          "qwen3 gate_up_proj", "qwen3 silu_mul", "qwen3 down_proj",
                          "qwen3 lm_head", "qwen3 argmax"}
    # Qwen3-8B: 32 q heads over 8 kv heads of 128, q|k|v rows 6144; 8 tokens, 4096-token
    # sequences in 64-token pages
    assert ("kernel::multitoken_paged_attention_hopper_impl<bfloat16, 4, 1, 8, 1024, 6144, 4096, "
            "128, -1, 4096, 64, 8, false, 1>(") in calls["qwen3 attention"]
    assert any("<bfloat16, 8, 64, 12288, 5, TMA_A, TMA_B, TMA_OUT, TMA_RESIDUAL, 4096, false>(" in l
               for l in calls["qwen3 down_proj"])
    assert "    &tma_residual," in calls["qwen3 o_proj"] and "    nullptr," not in calls["qwen3 o_proj"]
    # the lm_head over the padded vocab in 600 slices of 256 rows
    assert any("<bfloat16, 8, 256, 4096, 5, TMA_A, TMA_B, TMA_OUT, void, 153600, false>(" in l
               for l in calls["qwen3 lm_head"])
    rms = [d for d in p["dispatch"] if d["kernel"] == "rmsnorm_hopper"]
    assert rms and all(not d.get("filler") for d in rms)
    run = {l["id"] for g in p["graphs"] for l in g["layers"]}
    assert not run & {d["id"] for d in p["dispatch"] if d.get("filler")}
    assert "tasks/hopper/multitoken_paged_attention_hopper.cuh" in p["task_headers"]
    assert p["composition"].startswith("production-shaped: the qwen3 builder's decode tasks")
    payload = runtime.job_payload(k, checkout_root=PINNED)
    assert payload["composition_kind"] == p["composition"]
    assert "paged_attention_hopper (qwen3 attention)" in payload["composition"]

    # a linear replaces the model's plain linears, not its residual ones (another op)...
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    alone = copy.deepcopy(k.spec.data)
    alone["runtime"]["blocks"] = []
    lin = _fillers(_plan(alone))
    assert {"qwen3 qkv_proj", "qwen3 gate_up_proj", "qwen3 lm_head"}.isdisjoint(lin)
    assert {"qwen3 o_proj", "qwen3 down_proj", "qwen3 input_layernorm"} <= set(lin)
    # ... and a spec whose block runs other kernels of ours has them in place of theirs too
    companions = {c.name: c.spec.data for c in runtime.companions_for(k, {})}
    assert set(_fillers(_plan(k.spec.data, companions))) == {"qwen3 embed_tokens", "qwen3 attention",
                                                             "qwen3 argmax"}


@needs_tree
def test_the_minimal_composition_and_another_models_sizes_are_declared_in_the_spec():
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    data = copy.deepcopy(k.spec.data)
    data["runtime"]["composition"] = "minimal"
    p = _plan(data)
    assert not _fillers(p) and p["composition"].startswith("minimal")
    # Qwen3-32B's sizes (64 q heads over 8, hidden 5120, intermediate 25600)
    data["runtime"]["composition"] = {"hidden": 5120, "intermediate": 25600, "q_heads": 64}
    calls = _fillers(_plan(data))
    assert ("kernel::multitoken_paged_attention_hopper_impl<bfloat16, 8, 1, 8, 1024, 10240, 8192, "
            "128, -1, 4096, 64, 8, false, 1>(") in calls["qwen3 attention"]
    # the v2 gate has no model task set: minimal, and it says so
    assert composition.describe(composition.declared(k.spec.data), "v2").startswith("minimal (")


@pytest.mark.parametrize("sizes, words", [
    ({"q_heads": 30}, "q_heads 30 is not a multiple of kv_heads 8"),
    ({"vocab": 38304}, "the qwen3 layer argmax (argmax_hopper): 128 partial tasks do not divide vocab 38304"),
    ({"hidden": 4100}, "the qwen3 layer input_layernorm (rmsnorm_hopper): rms_norm_hopper_impl's static_asserts"),
])
def test_sizes_the_models_tasks_cannot_take_are_refused_at_the_field(project, sizes, words):
    flow = "{" + ", ".join(f"{k}: {v}" for k, v in sizes.items()) + "}"
    project.edit("specs/rmsnorm_v2.yaml", "runtime:\n", f"runtime:\n  composition: {flow}\n")
    run = project.scons("-n", "kernel=rmsnorm_v2", "stage=generate", check=False)
    assert run.returncode != 0
    err = run.stdout + run.stderr
    assert "specs/rmsnorm_v2.yaml" in err and "runtime.composition" in err and words in err, err[-2000:]


@needs_tree
@pytest.mark.nvcc
def test_a_composition_edit_makes_exactly_the_runtime_nodes_stale(project):
    """Built through the runtime stage, an edit of runtime.composition leaves every other
    node as it was: -n lists the megakernel, its compile and the gate, and only them."""
    mpk = f"mpk_root={PINNED}"
    built = project.scons("-k", "kernel=rmsnorm_v2", "stage=runtime", mpk, check=False)
    assert project.path("build/rmsnorm_v2/runtime/sm_90a/librmsnorm_v2_mpk.so").is_file(), built.stdout[-3000:]
    worker = project.path("build/rmsnorm_v2/runtime/sm_90a/worker.json").read_text()
    # each variant's worker alone is built beside it, from the same source: the model's tasks
    # and the other variants are what its registers grow by
    import json
    alone = lambda v: json.loads(project.path(f"build/rmsnorm_v2/runtime/sm_90a/alone/{v}/worker.json").read_text())
    variants = load_kernel(project.root, "rmsnorm_v2", write_cache=False).spec.data["codegen"]["variants"]
    for v in variants:
        assert project.path(f"build/rmsnorm_v2/runtime/sm_90a/alone/{v}/librmsnorm_v2_mpk.so").is_file()
        assert alone(v)["registers"] <= json.loads(worker)["registers"], (v, alone(v), worker)
    r1_alone = alone("decode_r1_h4096")
    # the one-row body alone (RESULTS 27: 95 registers) is far from the shared worker's
    assert r1_alone["registers"] < json.loads(worker)["registers"] - 64, (r1_alone, worker)
    listed = lambda: [l.strip() for l in project.scons("-n", "kernel=rmsnorm_v2", "stage=runtime", mpk,
                                                       check=False).stdout.splitlines()]
    before = listed()
    assert not [l for l in before if l.startswith("megakernel")], before
    project.edit("specs/rmsnorm_v2.yaml", "runtime:\n", "runtime:\n  composition: minimal\n")
    after = listed()
    # besides the spec's own check, only the megakernel's two nodes are new; the gate (the
    # stand-in GPU left it unpassed) is listed as before; no compile, validate or perf
    new = [l for l in after if l not in before]
    assert sorted(l.split()[0] for l in new) == ["megakernel", "megakernel-compile", "spec"], new
    assert any(l.startswith("runtime rmsnorm_v2") for l in after), after
    assert not [l for l in after if l.split()[0] in ("compile", "validate", "perf", "generate")], after
    # issue 59 item 3: a variant added to the spec joins the worker every variant is measured
    # in, so the gate measures them all again (and its result says what changed)
    project.edit("specs/rmsnorm_v2.yaml", "    decode_r8_h4096:    {rows: 8, hidden: 4096, rpt: 1}",
                 "    decode_r8_h4096:    {rows: 8, hidden: 4096, rpt: 1}\n    decode_r4_h4096:    {rows: 4, hidden: 4096, rpt: 1}")
    grown = listed()
    assert {"megakernel rmsnorm_v2", "megakernel-compile rmsnorm_v2 sm_90a"} <= set(grown), grown
    assert any(l.startswith("runtime rmsnorm_v2") for l in grown), grown
    # ... but not the worker a variant alone is measured in: built again, decode_r1_h4096's is
    # the worker it was (the variants cannot move each other there), and the new one has its own
    project.edit("specs/rmsnorm_v2.yaml", "runtime:\n  composition: minimal\n", "runtime:\n")
    project.scons("-k", "kernel=rmsnorm_v2", "stage=runtime", mpk, check=False)
    assert alone("decode_r1_h4096") == r1_alone
    assert alone("decode_r4_h4096")["registers"] > 0
