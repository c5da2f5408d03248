"""The incumbents: each table entry's call is what the checkout's own register function
emits (its CodeKeeper text, the template values this table derives at a shape), and a
checkout whose register function is missing or different has no incumbent, with the
reason. CPU only: the pinned MPK tree (../shared/mirage/mpk)."""
from __future__ import annotations

import re
import shutil

import pytest

from conftest import REPO
from mpkbuild.model.kernel import Kernel
from mpkbuild.stages.runtime import megakernel
from mpkbuild.wire import incumbents as inc
from mpkbuild.util import config
from mpkbuild.stages import load_kernel

PINNED = REPO.parent / "shared" / "mirage" / "mpk"
pytestmark = pytest.mark.skipif(not (PINNED / inc.REGISTER_FILE).is_file(),
                                reason="../shared/mirage (the pinned MPK tree) is absent")


def _text() -> str:
    return (PINNED / inc.REGISTER_FILE).read_text()


# (entry, op, shapes, params, the call it must emit) -- the values as the register function
# computes them from the task's tensor dims at that shape
CALLS = [
    ("linear_swapAB_hopper", "linear", {"inputs": [[8, 4096], [28672, 4096]], "outputs": [[8, 28672]]}, {},
     # grid_for_rmsnorm_linear_layer(28672) = 64 slices of 448 rows; the TMA types' values
     ["using TMA_B = kernel::tma::tma_2d<bfloat16, 3, 3, 3, 8, 4096, 8, 64, 4096, 1, 1, 2, 512, true>;",
      "using TMA_A = kernel::tma::tma_2d<bfloat16, 3, 3, 3, 448, 4096, 64, 64, 4096, 1, 1, 2, 4096, true>;",
      "using TMA_OUT = kernel::tma::tma_2d<bfloat16, 3, 3, 3, 8, 448, 8, 64, 28672, 1, 1, 1, 512, true>;",
      "TMA_A tma_a(static_cast<CUtensorMap*>(task_desc->input_tma_desc_ptrs[1][0]));",
      "TMA_B tma_b(static_cast<CUtensorMap*>(task_desc->input_tma_desc_ptrs[0][0]));",
      "TMA_OUT tma_out(static_cast<CUtensorMap*>(task_desc->output_tma_desc_ptrs[0][0]));",
      "kernel::linear_swapAB_kernel_hopper<bfloat16, 8, 448, 4096, 5, TMA_A, TMA_B, TMA_OUT, void, 28672, false>(",
      "tma_a,", "tma_b,", "tma_out,", "nullptr,", "false/*residual*/", ");"],
     "TASK_LINEAR_SWAPAB_HOPPER"),
    ("rmsnorm_hopper", "rmsnorm", {"inputs": [[8, 4096], [4096]], "outputs": [[8, 4096]]}, {},
     ["kernel::rms_norm_hopper_impl<bfloat16, 1, 4096>(", "task_desc->input_ptrs[0],",
      "task_desc->input_ptrs[1],", "task_desc->output_ptrs[0],", "1e-6f);"], "TASK_RMS_NORM_HOPPER"),
    ("silu_mul", "silu_mul", {"inputs": [[16, 2, 14336]], "outputs": [[16, 14336]]}, {},
     # grid_for_rmsnorm_linear_layer(28672) = 64 -> 32 tiles of 448 columns
     ["kernel::silu_mul_task_impl<bfloat16, 16, 448, 28672, 14336>(", "task_desc->input_ptrs[0],",
      "task_desc->output_ptrs[0],",
      "runtime_config.qo_indptr_buffer[MPK_MAX_NUM_BATCHED_REQUESTS]);"], "TASK_SILU_MUL"),
    ("silu_mul_hopper", "silu_mul", {"inputs": [[8, 2, 2304]], "outputs": [[8, 2304]]}, {},
     ["kernel::silu_mul_task_impl_hopper<bfloat16, 8, 48, 4608, 2304>(", "task_desc->input_ptrs[0],",
      "task_desc->output_ptrs[0],",
      "runtime_config.qo_indptr_buffer[MPK_MAX_NUM_BATCHED_REQUESTS]);"], "TASK_SILU_MUL_HOPPER"),
    ("embedding", "embedding", {"inputs": [[8], [129280, 7168]], "outputs": [[8, 7168]]}, {},
     ["kernel::embedding_kernel<bfloat16, 8, 7168, 7168>(", "task_desc->input_ptrs[0],",
      "task_desc->input_ptrs[1],", "task_desc->output_ptrs[0]);"], "TASK_EMBEDDING"),
    ("embedding_hopper", "embedding", {"inputs": [[16384], [129280, 7168]], "outputs": [[16384, 7168]]},
     {"grid": [2, 1024]},
     ["kernel::embedding_kernel_hopper<bfloat16, 16, 3584, 7168>(", "task_desc->input_ptrs[0],",
      "task_desc->input_ptrs[1],", "task_desc->output_ptrs[0]);"], "TASK_EMBEDDING_HOPPER"),
]


@pytest.mark.parametrize("name, op, shapes, params, call, task_type", CALLS, ids=[c[0] for c in CALLS])
def test_the_call_is_the_checkouts_register_text_at_the_shape(name, op, shapes, params, call, task_type):
    dtypes = {"inputs": ["int32" if op == "embedding" and i == 0 else "bf16"
                         for i in range(len(shapes["inputs"]))], "outputs": ["bf16"]}
    lay = inc.layout(name, op, shapes, dtypes, params, _text())
    (layer,) = lay["layers"]
    assert [l.strip() for l in layer["call"]] == call
    assert layer["task_type"] == task_type
    # and the register function's own lines (less a branch the builder does not take), a
    # value for each `$`, are those very lines
    lines, types = inc.register_function(_text(), layer["register"])
    kept = [l for l in lines if l not in inc.TABLE[name].skip]
    assert len(kept) == len(call)
    for got, raw in zip(call, kept):
        pattern = re.escape(raw.strip()).replace(r"\$", r"[\w\-]+")
        assert re.fullmatch(pattern, got), (raw, got)


def test_argmax_is_two_layers_of_two_register_functions():
    lay = inc.layout("argmax_hopper", "argmax", {"inputs": [[8, 129280]], "outputs": [[8]]},
                     {"inputs": ["bf16"], "outputs": ["int64"]}, {"tasks": 128}, _text())
    partial, reduce = lay["layers"]
    assert partial["call"][0].strip() == "kernel::argmax_partial_sm100_kernel<bfloat16, 8, 1010, 128>("
    assert partial["task_type"] == "TASK_ARGMAX_PARTIAL_SM100" and partial["grid"] == [128, 1]
    assert reduce["call"][0].strip() == "kernel::argmax_reduce_kernel<bfloat16, 8, 1010, 128>("
    assert reduce["task_type"] == "TASK_ARGMAX_REDUCE" and reduce["grid"] == [1, 1]
    assert lay["tensors"][-1]["compare_values_of"] == 0


def test_a_checkout_without_the_register_function_has_no_incumbent_and_says_why(tmp_path):
    tree = tmp_path / "mpk"
    (tree / "src" / "kernel").mkdir(parents=True)
    text = _text().replace("TaskRegister::register_rmsnorm_hopper_task(", "TaskRegister::register_rmsnorm_h_task(")
    (tree / inc.REGISTER_FILE).write_text(text)
    k = load_kernel(REPO, "rmsnorm_v2", write_cache=False)
    p = megakernel.plan(k.spec.data, config.SHIPPED_WIRING, None, tree)
    assert not [g for g in p["graphs"] if g["role"] == "incumbent"]
    (why,) = p["missing"]["decode_r1_h4096"]
    assert why == {"incumbent": "rmsnorm_hopper",
                   "why": "TaskRegister::register_rmsnorm_hopper_task is not in src/kernel/task_register.cc"}


def test_a_register_function_that_takes_other_values_is_refused(tmp_path):
    text = _text().replace('"kernel::rms_norm_hopper_impl<bfloat16, $, $>("',
                           '"kernel::rms_norm_hopper_impl<bfloat16, $, $, $>("')
    with pytest.raises(inc.NoIncumbent, match="emits 3 values on this checkout; the incumbent table knows 2"):
        inc.layout("rmsnorm_hopper", "rmsnorm", {"inputs": [[1, 4096], [4096]], "outputs": [[1, 4096]]},
                   {"inputs": ["bf16", "bf16"], "outputs": ["bf16"]}, {}, text)


def test_every_catalog_variant_has_an_incumbent_graph_or_a_reason():
    """The plan on the pinned tree: per variant an incumbent graph, or the reason (the
    spec's `none`); linear_swapAB_hopper runs at every linear_v2 variant."""
    from mpkbuild.model.kernel import discover
    for name in discover(REPO):
        k = load_kernel(REPO, name, write_cache=False)
        if "wiring" not in k.spec.data:
            continue
        specs = {c.name: c.spec.data for c in megakernel.companions_for(k, {})}
        p = megakernel.plan(k.spec.data, config.SHIPPED_WIRING, specs, PINNED)
        rivals = {g["of"] for g in p["graphs"] if g["role"] == "incumbent"}
        for v in k.spec.data["codegen"]["variants"]:
            assert v in rivals or p["missing"].get(v), (name, v)
        if name == "linear_v2":
            assert set(k.spec.data["codegen"]["variants"]) <= rivals and not p["missing"]


def test_block_rules_are_checked_where_the_spec_says_them():
    """runtime.blocks and the thresholds over their graphs: `block:` globs judge the block
    graphs only, an unknown incumbent or a glob that matches no block graph is refused at
    its field, and a v2 run judges no v1 block."""
    import copy
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    data = k.spec.data
    assert inc.block_graph_names(data) == [f"block:{name}:b{b}" for name in
                                           ("llama8b_mlp", "llama8b_mlp_fused", "llama8b_mlp_silu_epilogue")
                                           for b in (1, 8, 16)]
    assert inc.block_graph_names(data, "v2") == []
    names = list(data["codegen"]["variants"]) + inc.block_graph_names(data)
    assert inc.matching("*", names) == list(data["codegen"]["variants"])
    assert inc.matching("block:*", names) == inc.block_graph_names(data)
    assert list(inc.check_section(data)) == []
    bad = copy.deepcopy(data)
    bad["runtime"]["blocks"][0]["layers"][1]["incumbent"] = "linear_hopper_x"
    bad["runtime"]["thresholds"].append({"variants": "block:other*", "max_vs_incumbent": 1.0})
    problems = dict(inc.check_section(bad))
    assert problems[("runtime", "blocks", 0, "layers", 1, "incumbent")].startswith(
        "no incumbent named 'linear_hopper_x'")
    at = ("runtime", "thresholds", len(bad["runtime"]["thresholds"]) - 1, "variants")
    assert problems[at].startswith("'block:other*' matches no block graph")


def _calls_of(name, shapes, params):
    """(register, call, task type) of each layer of one incumbent at these shapes."""
    dtypes = {"inputs": ["bf16"] * len(shapes["inputs"]), "outputs": ["bf16"]}
    op = inc.TABLE[name].op
    return [(l["register"], l["call"], l["task_type"])
            for l in inc.layout(name, op, shapes, dtypes, params, _text())["layers"]]


def test_a_fused_ops_incumbent_is_the_chain_of_the_two_mpk_tasks_it_replaces():
    """rmsnorm_linear's incumbent is rmsnorm_hopper's call at x's shape, then
    linear_swapAB_hopper's at [rows, k] x W: each the very call its own entry makes, the
    normalised x a scratch tensor between them (never compared), the fused op's inputs
    routed by `feeds` (x and the norm weight to the norm, W to the linear)."""
    x, w, g, y = [8, 4096], [28672, 4096], [4096], [8, 28672]
    name = "rmsnorm_hopper_then_linear_swapAB_hopper"
    shapes = {"inputs": [x, w, g], "outputs": [y]}
    assert _calls_of(name, shapes, {}) == (
        _calls_of("rmsnorm_hopper", {"inputs": [x, g], "outputs": [x]}, {})
        + _calls_of("linear_swapAB_hopper", {"inputs": [x, w], "outputs": [y]}, {}))
    lay = inc.layout(name, "rmsnorm_linear", shapes, {"inputs": ["bf16"] * 3, "outputs": ["bf16"]}, {}, _text())
    t = lay["tensors"]
    norm, linear = lay["layers"]
    assert [t[i] for i in norm["inputs"]] == [{"use": "input", "index": 0}, {"use": "input", "index": 2}]
    (mid,) = norm["outputs"]
    assert t[mid] == {"use": "scratch", "shape": x, "dtype": "bf16"}
    assert linear["inputs"] == [mid, lay["weight"]] and t[lay["weight"]] == {"use": "input", "index": 1}
    assert [t[i] for i in linear["outputs"]] == [{"use": "output", "index": 0}]
    assert inc.stands_for("rmsnorm_linear") == {"rmsnorm_linear", "rmsnorm", "linear"}


def test_a_chains_params_are_named_by_the_part_they_set():
    """silu_mul and the linear both take `tasks`: a chain's params say whose
    (`linear_with_residual.tasks`), and its best configurations are its linear's."""
    name = "silu_mul_then_linear_swapAB_with_residual_hopper"
    shapes = {"inputs": [[8, 28672], [4096, 14336], [8, 4096]], "outputs": [[8, 4096]]}
    dtypes = {"inputs": ["bf16"] * 3, "outputs": ["bf16"]}
    lay = inc.layout(name, "silu_mul_linear_with_residual", shapes, dtypes,
                     {"linear_with_residual.tasks": 64, "silu_mul.tasks": 16}, _text())
    silu, linear = lay["layers"]
    assert silu["grid"] == [16, 1] and linear["grid"] == [64, 1]
    assert lay["tensors"][0] == {"use": "gate_up_tiles", "index": 0, "tiles": 16}
    assert [c["linear_with_residual.tasks"] for c in
            inc.best_candidates(name, shapes, {"linear_with_residual.tasks": 64})] == [32, 16, 8]
    import copy
    k = load_kernel(REPO, "silu_mul_linear_residual_v2", write_cache=False)
    bad = copy.deepcopy(k.spec.data)
    bad["runtime"]["incumbent"][0]["params"] = {"tasks": 64}
    assert dict(inc.check_section(bad))[("runtime", "incumbent", 0, "params", "tasks")].startswith(
        f"{name} takes no param 'tasks'")


def test_the_fused_blocks_chain_is_the_unfused_blocks_chain():
    """Folding layers into ours changes our side only: the chain each fused block runs
    against is MPK's same four tasks, with the same calls, tiles and events (the gate|up
    weight's rows shuffled for silu_mul's tiles, its 32 events), whether silu_mul is part
    of the down projection's incumbent (a chain of two) or of the gate|up one's (of three)."""
    k = load_kernel(REPO, "linear_v2", write_cache=False)
    specs = {c.name: c.spec.data for c in megakernel.companions_for(k, {})}
    p = megakernel.plan(k.spec.data, config.SHIPPED_WIRING, specs, PINNED)
    chains = {g["of"]: g for g in p["graphs"] if g["role"] == "incumbent" and g["of"].startswith("block:")}
    calls = {d["id"]: (d["task_type"], tuple(d["call"])) for d in p["dispatch"]}
    for b in (1, 8, 16):
        plain = chains[f"block:llama8b_mlp:b{b}"]
        assert sum(len(l.get("events", {}).get("launches", [])) for l in plain["layers"]) == 32
        for block, down in (("llama8b_mlp_fused", "decode_m{b}_n4096_k14336"),
                            ("llama8b_mlp_silu_epilogue", "decode_m{b}_n4096_k14336")):
            fused = chains[f"block:{block}:b{b}"]
            assert len(fused["layers"]) == 4
            for a, f in zip(plain["layers"], fused["layers"]):
                assert calls[a["id"]] == calls[f["id"]]
                assert a.get("events") == f.get("events")
                assert a["strides"] == f["strides"] and a["tma_dims"] == f["tma_dims"]
            assert sum("gate_up_rows" == t["use"] for t in fused["tensors"]) == 1
            ours = next(g for g in p["graphs"] if g["name"] == f"block:{block}:b{b}")
            assert [l["variant"] for l in ours["layers"]] == [f"decode_m{b}_n28672_k4096", down.format(b=b)]


def test_a_chain_of_three_routes_its_inputs_and_shuffles_the_gate_up_weight_for_silu_mul():
    """rmsnorm_linear_silu_mul's incumbent: rmsnorm_hopper on x and the norm weight, the
    linear over the gate|up weight its rows shuffled into silu_mul's tiles (the builder's
    shuffle_tensors), silu_mul's tiles reading the linear's output, a scratch never compared;
    its dtypes and its best configurations (the linear's task counts) come from its parts."""
    x, w, g, y = [16, 4096], [28672, 4096], [4096], [16, 14336]
    name = "rmsnorm_hopper_then_linear_swapAB_hopper_then_silu_mul"
    shapes = {"inputs": [x, w, g], "outputs": [y]}
    assert _calls_of(name, shapes, {}) == (
        _calls_of("rmsnorm_hopper", {"inputs": [x, g], "outputs": [x]}, {})
        + _calls_of("linear_swapAB_hopper", {"inputs": [x, w], "outputs": [[16, 28672]]}, {})
        + _calls_of("silu_mul", {"inputs": [[16, 28672]], "outputs": [y]}, {}))
    lay = inc.layout(name, "rmsnorm_linear_silu_mul", shapes, {"inputs": ["bf16"] * 3, "outputs": ["bf16"]},
                     {}, _text())
    t = lay["tensors"]
    norm, linear, silu = lay["layers"]
    assert [t[i] for i in norm["inputs"]] == [{"use": "input", "index": 0}, {"use": "input", "index": 2}]
    assert linear["inputs"][0] == norm["outputs"][0] and t[norm["outputs"][0]]["use"] == "scratch"
    assert t[linear["inputs"][1]] == {"use": "gate_up_rows", "index": 1, "tiles": 32}
    assert silu["inputs"] == linear["outputs"] and t[linear["outputs"][0]] == {
        "use": "scratch", "shape": [16, 28672], "dtype": "bf16"}
    assert [t[i] for i in silu["outputs"]] == [{"use": "output", "index": 0}]
    assert linear["grid"] == [64, 1] and silu["grid"] == [32, 1] and lay["weight"] is None
    assert inc.stands_for("rmsnorm_linear_silu_mul") == {"rmsnorm_linear_silu_mul", "rmsnorm", "linear", "silu_mul"}
    with pytest.raises(inc.NoIncumbent, match=r"takes inputs \['bf16', 'bf16', 'bf16'\]"):
        inc.layout(name, "rmsnorm_linear_silu_mul", shapes, {"inputs": ["bf16"] * 2, "outputs": ["bf16"]}, {}, _text())
    assert [c["linear.tasks"] for c in inc.best_candidates(name, shapes, {})] == [112, 224, 56]


def test_a_chains_events_inside_it_are_mpks():
    """The incumbent of one rmsnorm_linear_silu_mul variant alone: the 32 events between its
    linear's 64 slices and silu_mul's 32 tiles, as in the blocks (MPK's compile makes them
    within a layer chain as between any two layers), and none between the norm and the
    linear (the linear reads x whole)."""
    k = load_kernel(REPO, "rmsnorm_linear_silu_mul_v2", write_cache=False)
    p = megakernel.plan(k.spec.data, config.SHIPPED_WIRING, {}, PINNED)
    g = next(g for g in p["graphs"] if g["name"] == "incumbent:decode_m8_n28672_k4096:"
             "rmsnorm_hopper_then_linear_swapAB_hopper_then_silu_mul")
    norm, linear, silu = g["layers"]
    assert "events" not in norm and "events" not in silu
    assert linear["events"]["launches"] == [1] * 32 and len(linear["events"]["event_of"]) == 64
