"""The wiring section (schema, semantic checks, defaults) and pure rendering of fragments."""
from __future__ import annotations

import shutil

import pytest

from mpkbuild import wire
from test_wire_helpers import WIRING, rmsnorm_spec, silu_spec

jsonschema = pytest.importorskip("jsonschema")


def test_schema_is_valid_and_accepts_the_examples():
    jsonschema.Draft202012Validator.check_schema(wire.WIRING_SCHEMA)
    v = jsonschema.Draft202012Validator(wire.WIRING_SCHEMA)
    assert list(v.iter_errors(rmsnorm_spec()["wiring"])) == []
    assert list(v.iter_errors(silu_spec()["wiring"])) == []
    errors = list(v.iter_errors({"layer": "x", "numbr": {"sm_90a": 3}}))
    assert [e.validator for e in errors] == ["additionalProperties"]
    errors = list(v.iter_errors({"number": {"sm_90a": "next"}}))
    assert errors, "a number must be an integer or \"auto\""
    errors = list(v.iter_errors({"task_type": {"sm_80": "TASK_X"}}))
    assert errors, "unknown arch key"


def test_defaults_fill_every_name():
    spec = rmsnorm_spec()
    # every name from its default; the call stays: rpt is a tile dim the defaults cannot name
    spec["wiring"] = {"call": spec["wiring"]["call"]}
    frags = wire.render(spec, WIRING, {"sm_90a": 170, "sm_100a": 240})
    assert frags["enum.sm_90a.h"] == "  TASK_RMSNORM_V2_HOPPER = 170,\n"
    assert frags["enum.sm_100a.h"] == "  TASK_RMSNORM_V2_SM100 = 240,\n"
    assert 'else if (name == "rmsnorm_v2_sm100")' in frags["graph_branch.sm_100a.cc"]
    assert frags["layer.py"].startswith("    def rmsnorm_layer(")   # the op, by default
    assert "task_offset.sm_90a.cc" in frags                          # tile-indexed by default


def test_a_template_argument_from_the_task_tile_follows_the_layers_grid():
    # embedding_v2's tokens per task (rpt) is no layer param: its register function reads it
    # from the output tile's rows, so whatever grid the layer gives, the call matches it
    import yaml
    from conftest import REPO
    spec = yaml.safe_load((REPO / "specs" / "embedding_v2.yaml").read_text())
    fn = wire.render(spec, WIRING, {"sm_90a": 170, "sm_100a": 240})["register_fn.sm_90a.cc"]
    assert "assert(params.size() == 0);" in fn
    assert "int const rpt = output_ops[0]->output_tensors[0].dim[0];" in fn
    # the body's function, in the body's namespace (not upstream's kernel::embedding_v2)
    assert 'code.e("kernel::mpkbuild_embedding_v2::embedding_v2_task<$, $>(",\n         hidden,\n         rpt);' in fn


def test_render_is_pure_and_deterministic():
    a = wire.render(rmsnorm_spec(), WIRING)
    b = wire.render(rmsnorm_spec(), WIRING)
    assert a == b
    # without a checkout an auto number stays a visible placeholder and no tma case is guessed
    assert "auto" in a["enum.sm_90a.h"] and not any(k.startswith("tma_") for k in a)
    # explicit numbers need no checkout
    s = wire.render(silu_spec(), WIRING)
    assert s["enum.sm_90a.h"] == "  TASK_SILU_MUL_V1_HOPPER = 160,\n"
    assert "tma_create.sm_90a.cuh" in s and "tma_create.sm_100a.cuh" not in s
    assert "task_offset.sm_90a.cc" not in s                          # tile_indexed: false


def test_only_wiring_and_codegen_fields_change_fragments():
    base = wire.render(rmsnorm_spec(), WIRING)
    spec = rmsnorm_spec()
    spec["perf"]["repeats"] = 99
    spec["description"] = "edited"
    assert wire.render(spec, WIRING) == base
    spec["validate"]["rel_max"] = 0.01                 # the test-mode test compares with it
    assert wire.render(spec, WIRING) != base
    spec["wiring"]["tile_indexed"] = False
    assert wire.render(spec, WIRING, {"sm_90a": 153}) != wire.render(rmsnorm_spec(), WIRING, {"sm_90a": 153})


@pytest.mark.parametrize("wiring,path,text", [
    ({"task_type": {"sm_80a": "TASK_X"}}, "wiring.task_type.sm_80a", "not in the spec's archs"),
    ({"task_name": {"sm_90a": "same", "sm_100a": "same"}}, "wiring.task_name.sm_100a", "also used"),
    ({"num_inputs": 3}, "wiring.num_inputs", "disagrees"),
    ({"tensors": {"nope": {"forloop_dim": 0}}}, "wiring.tensors.nope", "no codegen tensor"),
    ({"tensors": {"weight": {"partition": [1]}}}, "wiring.tensors.weight.partition", "distinct dims"),
    ({"call": {"template_args": ["rows_per_task"]}}, "wiring.call.template_args.0", "not a dim"),
    ({"test_variant": "huge"}, "wiring.test_variant", "not in codegen.variants"),
    ({"params": [{"name": "code"}]}, "wiring.params.0.name", "reserved"),
    ({"number": {"sm_90a": 0}}, "wiring.number.sm_90a", "positive integer"),
])
def test_check_section_names_the_field(wiring, path, text):
    spec = rmsnorm_spec()
    spec["wiring"] = wiring
    problems = wire.check_section(spec)
    assert any(p == path and text in m for p, m in problems), problems


def test_split_dim_template_arg_reads_the_whole_tensor():
    spec = silu_spec()
    spec["wiring"]["call"] = {"template_args": ["rows", {"symbol": "tile_cols", "tensor": "up",
                                                         "dim": 1, "of": "tile"},
                                                {"literal": "bfloat16"}]}
    fn = wire.render(spec, WIRING)["register_fn.sm_90a.cc"]
    assert "int const rows = output_ops[0]->dtensor.dim[0];" in fn
    assert "int const tile_cols = input_ops[1]->output_tensors[0].dim[1];" in fn
    assert 'code.e("kernel::mpkbuild_silu_mul_v1::silu_mul_v1_task<$, $, bfloat16>(",' in fn


def test_template_errors_name_template_and_line(tmp_path):
    root = tmp_path / "wiring"
    shutil.copytree(WIRING, root)
    layer = root / "templates" / "layer.py.j2"
    lines = layer.read_text().splitlines(keepends=True)
    lines.insert(3, "    {{ no_such_value }}\n")
    layer.write_text("".join(lines))
    with pytest.raises(wire.TemplateError) as err:
        wire.render(rmsnorm_spec(), root)
    assert "templates/layer.py.j2:4" in str(err.value) and "no_such_value" in str(err.value)
    layer.write_text("{% for x in %}\n")
    with pytest.raises(wire.TemplateError, match=r"templates/layer.py.j2:1: syntax error"):
        wire.render(rmsnorm_spec(), root)


def test_surface_errors_are_reported(tmp_path):
    root = tmp_path / "wiring"
    shutil.copytree(WIRING, root)
    s = root / "surface.yaml"
    s.write_text(s.read_text().replace("    where: before\n", "    where: above\n", 1))
    with pytest.raises(wire.SurfaceError, match="where must be before or after"):
        wire.render(rmsnorm_spec(), root)
    assert wire.check_section(rmsnorm_spec(), root)[0][0] == "wiring"
