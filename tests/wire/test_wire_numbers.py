"""TaskType numbering, name claims across kernels and the checkout, and the coherence check."""
from __future__ import annotations

import pytest

from mpkbuild import wire
from test_wire_helpers import coherence, WIRING, fresh_tree, rmsnorm_spec, silu_spec


@pytest.fixture
def tree(tmp_path):
    return fresh_tree(tmp_path)


def auto(spec):
    spec["wiring"]["number"] = {a: "auto" for a in spec["archs"]}
    return spec


def test_auto_takes_lowest_free_numbers_in_each_range(tree):
    # fixture Hopper range 150..198 holds 151, 152, 155; SM100 230..298 holds 231, 232
    p = wire.plan(tree, [rmsnorm_spec(), auto(silu_spec())], WIRING, ["rmsnorm_v2", "silu_mul_v1"])
    # SM100: the non-TMA sub-range (257 and up) first
    assert p.numbers == {"rmsnorm_v2": {"sm_90a": 153, "sm_100a": 257},
                         "silu_mul_v1": {"sm_90a": 154, "sm_100a": 258}}
    wire.apply(p)
    third = auto(silu_spec())
    third.update(kernel="gelu_v1", op="gelu")
    p3 = wire.plan(tree, [rmsnorm_spec(), auto(silu_spec()), third], WIRING, ["gelu_v1"])
    assert p3.numbers == {"gelu_v1": {"sm_90a": 156, "sm_100a": 259}}   # 155 is taken


def test_auto_keeps_the_number_a_kernel_already_holds(tree):
    wire.apply(wire.plan(tree, [auto(silu_spec())], WIRING, ["silu_mul_v1"]))   # takes 153/257
    p = wire.plan(tree, [rmsnorm_spec(), auto(silu_spec())], WIRING, ["rmsnorm_v2", "silu_mul_v1"])
    assert p.numbers["silu_mul_v1"] == {"sm_90a": 153, "sm_100a": 257}
    assert p.numbers["rmsnorm_v2"] == {"sm_90a": 154, "sm_100a": 258}


def test_auto_avoids_numbers_other_specs_claim_explicitly(tree):
    silu = silu_spec()
    silu["wiring"]["number"] = {"sm_90a": 153, "sm_100a": 257}
    p = wire.plan(tree, [rmsnorm_spec(), silu], WIRING, ["rmsnorm_v2"])   # silu not applied
    assert p.numbers["rmsnorm_v2"] == {"sm_90a": 154, "sm_100a": 258}


def test_explicit_number_clashing_with_checkout_entry(tree):
    silu = silu_spec()
    silu["wiring"]["number"]["sm_90a"] = 152
    with pytest.raises(wire.NumberClash) as err:
        wire.plan(tree, [silu], WIRING, ["silu_mul_v1"])
    msg = str(err.value)
    assert "TASK_SILU_MUL_V1_HOPPER" in msg and "TASK_RMS_NORM_HOPPER" in msg
    assert "runtime_header.h:18" in msg


def test_explicit_number_out_of_range(tree):
    silu = silu_spec()
    silu["wiring"]["number"]["sm_90a"] = 198           # the END placeholder itself
    with pytest.raises(wire.NumberOutOfRange, match=r"wiring.number.sm_90a = 198.*150.*198"):
        wire.plan(tree, [silu], WIRING, ["silu_mul_v1"])
    silu["wiring"]["number"]["sm_90a"] = 240           # an SM100 number for Hopper
    with pytest.raises(wire.NumberOutOfRange, match="TASK_HOPPER_TASK_BEGIN"):
        wire.plan(tree, [silu], WIRING, ["silu_mul_v1"])


def test_two_kernels_claiming_one_number(tree):
    rms = rmsnorm_spec()
    rms["wiring"]["number"] = {"sm_90a": 160, "sm_100a": "auto"}
    with pytest.raises(wire.NumberClash) as err:
        wire.plan(tree, [rms, silu_spec()], WIRING, ["rmsnorm_v2"])   # even if silu isn't applied
    assert "rmsnorm_v2" in str(err.value) and "silu_mul_v1" in str(err.value)
    assert "160" in str(err.value)


def test_two_kernels_claiming_one_name(tree):
    silu = silu_spec()
    silu["wiring"]["task_type"] = {"sm_90a": "TASK_RMSNORM_V2_HOPPER"}
    with pytest.raises(wire.NameClash) as err:
        wire.plan(tree, [rmsnorm_spec(), silu], WIRING, ["silu_mul_v1"])
    assert "rmsnorm_v2" in str(err.value) and "silu_mul_v1" in str(err.value)
    silu = silu_spec()
    silu["wiring"]["layer"] = "rmsnorm_v2"
    with pytest.raises(wire.NameClash, match="layer.*rmsnorm_v2.*silu_mul_v1"):
        wire.plan(tree, [rmsnorm_spec(), silu], WIRING, ["rmsnorm_v2", "silu_mul_v1"])


def test_name_already_in_checkout(tree):
    spec = rmsnorm_spec()
    del spec["wiring"]["layer"]            # default: the op, and rmsnorm_layer exists
    with pytest.raises(wire.NameClash) as err:
        wire.plan(tree, [spec], WIRING, ["rmsnorm_v2"])
    assert "persistent_kernel.py" in str(err.value) and "'rmsnorm'" in str(err.value)
    spec = rmsnorm_spec()
    spec["wiring"]["task_type"]["sm_90a"] = "TASK_ARGMAX_HOPPER"
    with pytest.raises(wire.NameClash, match=r"runtime_header.h:\d+: task_type 'TASK_ARGMAX_HOPPER'"):
        wire.plan(tree, [spec], WIRING, ["rmsnorm_v2"])


def test_tma_case_follows_the_number(tree):
    silu = silu_spec()
    silu["wiring"]["number"] = {"sm_90a": 160, "sm_100a": 240}   # 240: inside 231..256
    p = wire.plan(tree, [silu], WIRING, ["silu_mul_v1"])
    tma = p.new_contents["include/mirage/persistent_kernel/tma.cuh"]
    assert "case TASK_SILU_MUL_V1_SM100:" in tma and "case TASK_SILU_MUL_V1_HOPPER:" in tma
    silu["wiring"]["number"]["sm_100a"] = 257                    # outside: no case
    p = wire.plan(tree, [silu], WIRING, ["silu_mul_v1"])
    tma = p.new_contents["include/mirage/persistent_kernel/tma.cuh"]
    assert "case TASK_SILU_MUL_V1_SM100:" not in tma
    assert "case TASK_SILU_MUL_V1_HOPPER:" in tma
    assert "tma_create.sm_100a.cuh" not in p.fragments["silu_mul_v1"]
    assert "tma_fill.sm_90a.cuh" in p.fragments["silu_mul_v1"]       # both switches, break cases
    assert "break;" in p.fragments["silu_mul_v1"]["tma_create.sm_90a.cuh"]


def test_coherence_catches_missing_name_map_entry(tree):
    wire.apply(wire.plan(tree, [rmsnorm_spec()], WIRING, ["rmsnorm_v2"]))
    assert coherence(tree) == []
    rt = tree / "src" / "kernel" / "runtime.cc"
    rt.write_text(rt.read_text().replace(
        '  task_type_to_name[TASK_RMSNORM_V2_SM100] = "TASK_RMSNORM_V2_SM100";\n', ""))
    problems = coherence(tree)
    assert any("TASK_RMSNORM_V2_SM100" in p and "task_type_to_name" in p for p in problems), problems
    # an existing entry losing its name-map line is caught as well
    rt.write_text(rt.read_text().replace(
        '  task_type_to_name[TASK_ARGMAX_HOPPER] = "TASK_ARGMAX_HOPPER";\n', ""))
    assert any("TASK_ARGMAX_HOPPER" in p for p in coherence(tree))


def test_coherence_catches_missing_tma_case_and_branch(tree):
    tma = tree / "include" / "mirage" / "persistent_kernel" / "tma.cuh"
    tma.write_text(tma.read_text().replace("    case TASK_ARGMAX_HOPPER: {\n      break;\n    }\n", ""))
    problems = coherence(tree)
    assert problems == [p for p in problems if "TASK_ARGMAX_HOPPER" in p] and len(problems) == 1
    assert "TMA range" in problems[0]
    wire.apply(wire.plan(fresh_tree(tree.parent / "b"), [rmsnorm_spec()], WIRING, ["rmsnorm_v2"]))
    b = tree.parent / "b" / "mpk"
    g = b / "src" / "kernel" / "graph.cc"
    text = g.read_text()
    start = text.index("  // >>>mpk-wire:rmsnorm_v2/sm_90a/graph_branch:")
    end = text.index("  // <<<mpk-wire:rmsnorm_v2/sm_90a/graph_branch")
    g.write_text(text[:start] + text[text.index("\n", end) + 1:])
    problems = coherence(b)
    assert any("TASK_RMSNORM_V2_HOPPER" in p and "register_task branch" in p for p in problems)
