"""Runtime state and task metadata reach a body (codegen.inputs[].runtime, codegen.task_metadata):
the wired call passes them as the tree's own register functions do, a layer never takes runtime
state as a tensor, the builder sets the metadata the body reads, and a checkout that lacks a
field is refused naming it, writing nothing."""
from __future__ import annotations

import copy

import pytest
import yaml

from conftest import REPO
from mpkbuild import wire
from mpkbuild.wire.errors import SectionError, WireError
from test_wire_helpers import (WIRING, build_driver, fresh_tree, rmsnorm_spec, run_driver,
                               snapshot)
from test_wire_real import MIRAGE, catalog, copy_tree


def tokens_spec() -> dict:
    return yaml.safe_load((REPO / "specs" / "embedding_tokens_v2.yaml").read_text())


def metadata_spec(*names: str, tile_indexed: bool = False) -> dict:
    """rmsnorm_v2 taking task metadata (the body is not rendered here: wiring only)."""
    spec = copy.deepcopy(rmsnorm_spec())
    spec["codegen"]["task_metadata"] = list(names)
    spec["wiring"] = {**(spec.get("wiring") or {}), "tile_indexed": tile_indexed}
    return spec


def test_the_step_tokens_are_the_runtimes_and_no_tensor_of_the_layer():
    frags = wire.render(tokens_spec(), WIRING)
    fn = frags["register_fn.sm_90a.cc"]
    assert "assert(bgraph.operators.size() == (size_t)(num_inputs + num_outputs));" in fn
    assert "int const num_inputs = 1;" in fn                   # the table only
    calls = [ln for ln in fn.splitlines() if "code.e(" in ln]
    # in the body's order: the tokens (the runtime's, from step[0]), the table, the output
    assert calls[2].endswith('"    reinterpret_cast<int64_t const *>(runtime_config.tokens + '
                             'runtime_config.step[0]),");')
    assert calls[3].endswith('"    static_cast<__nv_bfloat16 const *>(task_desc->input_ptrs[0]),");')
    layer = frags["layer.py"]
    assert "tokens:" not in layer and "self.kn_graph.customized([table, output], tb_graph)" in layer
    assert "test_mode.py" not in frags                          # it could not feed the tokens


def test_a_checkout_without_the_runtimes_tokens_is_refused_naming_them(tmp_path):
    tree = fresh_tree(tmp_path)                     # the fixture tree has no RuntimeConfig
    before = snapshot(tree)
    with pytest.raises(WireError) as exc:
        wire.apply(wire.plan(tree, [tokens_spec()], WIRING, ["embedding_tokens_v2"]))
    assert "RuntimeConfig has no `long long *tokens`" in str(exc.value), exc.value
    assert snapshot(tree) == before


@pytest.mark.skipif(not (MIRAGE / "mpk").is_dir(), reason=f"{MIRAGE} is absent")
def test_on_the_pinned_tree_the_tokens_kernel_wires_with_a_note_for_its_test(tmp_path):
    root = copy_tree("mpk", tmp_path)
    specs, sources = catalog()
    p = wire.plan(root, specs, WIRING, ["embedding_tokens_v2"], sources=sources)
    assert p.problems == []
    assert any("embedding_tokens_v2: no test-mode test (it reads runtime state, tokens" in n
               for n in p.notes)
    assert not any(rel.startswith("tests/runtime_python") for rel in p.changes)


def test_task_metadata_is_set_by_the_builder_and_passed_by_the_call(tmp_path):
    spec = metadata_spec("request_id", "kv_idx")
    frags = wire.render(spec, WIRING)
    calls = [ln.strip() for ln in frags["register_fn.sm_90a.cc"].splitlines() if "code.e(" in ln]
    # after the tensors, in TASK_METADATA's order, then the task index (0: not tile-indexed)
    assert calls[-5:-2] == ['code.e("    task_desc->task_metadata.request_id,");',
                            'code.e("    task_desc->task_metadata.kv_idx,");',
                            'code.e("    0,");']
    builder = frags["task_offset.sm_90a.cc"]
    assert "task.task_metadata.request_id = bid.x;" in builder
    assert "task.task_metadata.kv_idx = bid.x;" in builder and "task_offset" not in builder
    # the builder and the register function compile in the tree and dispatch
    tree = fresh_tree(tmp_path)
    wire.apply(wire.plan(tree, [spec], WIRING, ["rmsnorm_v2"]))
    res = run_driver(build_driver(tree), "rmsnorm_v2_hopper", "1x4096:8x4096", "4096:4096",
                     "1x4096:8x4096")
    assert res.returncode == 0, res.stderr
    code = [ln[6:].strip() for ln in res.stdout.splitlines() if ln.startswith("code| ")]
    assert "task_desc->task_metadata.request_id," in code


def test_task_metadata_beside_a_task_index_is_refused_as_the_union_it_shares():
    with pytest.raises(SectionError) as exc:
        wire.render(metadata_spec("expert_offset", tile_indexed=True), WIRING)
    assert "wiring.tile_indexed" in str(exc.value)
    assert "shares TaskMetadata's bytes with task_offset (a union)" in str(exc.value)
