"""The compile stage: ptxas parsing and the resource gate, plus real nvcc for both archs."""
import json

import pytest

from mpkbuild.stages import compile as nvcc

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z21rmsnorm_v2__decode_a1PK13__nv_bfloat16Py' for 'sm_90a'
ptxas info    : Function properties for _Z21rmsnorm_v2__decode_a1PK13__nv_bfloat16Py
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 62 registers, used 1 barriers
ptxas info    : Compiling entry function '_Z19rmsnorm_v2__large_bPK13__nv_bfloat16Py' for 'sm_90a'
ptxas info    : Function properties for _Z19rmsnorm_v2__large_bPK13__nv_bfloat16Py
    24 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
"""


def job(tmp_path, smem_total=16, budget=224256):
    return nvcc.CompileJob(kernel="rmsnorm_v2", arch="sm_90a", variants=("decode_a1", "large_b"),
                           harness=tmp_path / "h.cu", library=tmp_path / "lib.so",
                           resources=tmp_path / "r.json", log=tmp_path / "log",
                           smem_total=smem_total, smem_budget=budget)


def test_parse_ptxas_reads_every_number():
    fns = nvcc.parse_ptxas(PTXAS)
    large = fns["_Z19rmsnorm_v2__large_bPK13__nv_bfloat16Py"]
    assert large == {"arch": "sm_90a", "entry": True, "registers": 255, "barriers": 1, "static_smem": 2048,
                     "stack": 24, "spill_stores": 40, "spill_loads": 36}
    assert fns["_Z21rmsnorm_v2__decode_a1PK13__nv_bfloat16Py"]["registers"] == 62


# a task body that is its own function (__noinline__): ptxas lists its properties after the
# entries that call it, by its own name, and the entry's stack with the callee's frame
CALLED = """\
ptxas info    : Compiling entry function '_Z21rmsnorm_v2__decode_a1PK13__nv_bfloat16Py' for 'sm_90a'
ptxas info    : Function properties for _Z21rmsnorm_v2__decode_a1PK13__nv_bfloat16Py
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 238 registers, used 1 barriers, 48 bytes cumulative stack size, 6080 bytes smem
ptxas info    : Compile time = 24.1 ms
ptxas info    : Function properties for _ZN6kernel10rmsnorm_v2_taskILi1EEEvPK13__nv_bfloat16
    32 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
"""


def test_a_called_function_keeps_its_own_numbers_and_its_spills_fail_the_gate(tmp_path):
    fns = nvcc.parse_ptxas(CALLED)
    entry = fns["_Z21rmsnorm_v2__decode_a1PK13__nv_bfloat16Py"]
    assert (entry["entry"], entry["registers"], entry["static_smem"], entry["stack"]) == (True, 238, 6080, 48)
    assert entry["spill_stores"] == entry["spill_loads"] == 0      # not the callee's, printed after it
    task = fns["_ZN6kernel10rmsnorm_v2_taskILi1EEEvPK13__nv_bfloat16"]
    assert (task["entry"], task["stack"], task["spill_stores"], task["spill_loads"]) == (False, 32, 8, 12)
    one = job(tmp_path)
    result = nvcc.resource_verdict(nvcc.CompileJob(**{**one.__dict__, "variants": ("decode_a1",)}), fns)
    assert result["verdict"] == "fail"
    assert result["problems"] == ["_ZN6kernel10rmsnorm_v2_taskILi1EEEvPK13__nv_bfloat16 (called, not inlined): "
                                  "spills 8 bytes stored / 12 bytes loaded"]


def test_spills_fail_the_gate_with_numbers(tmp_path):
    result = nvcc.resource_verdict(job(tmp_path), nvcc.parse_ptxas(PTXAS))
    assert result["verdict"] == "fail"
    assert result["problems"] == ["large_b: spills 40 bytes stored / 36 bytes loaded (255 registers)"]


def test_smem_over_budget_fails_the_gate(tmp_path):
    clean = PTXAS.replace("40 bytes spill stores, 36 bytes spill loads", "0 bytes spill stores, 0 bytes spill loads")
    result = nvcc.resource_verdict(job(tmp_path, smem_total=4096, budget=5000), nvcc.parse_ptxas(clean))
    assert result["verdict"] == "fail"
    assert result["problems"] == ["large_b: SMEM 6144 bytes (static 2048 + planned 4096) > budget 5000"]


def test_missing_entry_function_fails(tmp_path):
    only_one = PTXAS.split("ptxas info    : Compiling entry function '_Z20")[0]
    result = nvcc.resource_verdict(job(tmp_path), nvcc.parse_ptxas(only_one))
    assert result["verdict"] == "fail" and "large_b" in result["problems"][0]


def test_gencode_flags():
    assert nvcc.gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert nvcc.gencode("sm_100a") == "-gencode=arch=compute_100a,code=sm_100a"


@pytest.mark.nvcc
def test_both_archs_compile_with_clean_resources(built):
    for arch in ("sm_90a", "sm_100a"):
        res = json.loads((built.root / "build" / "rmsnorm_v2" / arch / "resources.json").read_text())
        assert res["verdict"] == "pass" and res["arch"] == arch
        assert len(res["variants"]) == 8
        for v in res["variants"].values():
            assert v["spill_stores"] == v["spill_loads"] == 0 and v["registers"] > 0
        assert (built.root / "build" / "rmsnorm_v2" / arch / "librmsnorm_v2.so").stat().st_size > 0
        log = (built.root / "build" / "rmsnorm_v2" / arch / "compile.log").read_text()
        assert nvcc.gencode(arch) in log


@pytest.mark.nvcc
def test_forced_spill_fails_the_build_and_leaves_no_library(project):
    # a body that keeps 2 x 32 uint4 per thread: more registers than any launch bound allows
    # (256 threads: the most an MPK worker block has, K_spec.h asserts it)
    project.edit("specs/rmsnorm_v2.yaml", "threads: 128", "threads: 256")
    project.edit("specs/rmsnorm_v2.yaml", "multiple_of: threads * vec_elems", "multiple_of: 1024")
    spec = project.path("specs/rmsnorm_v2.yaml")
    text = spec.read_text()
    start = text.index("  variants:")
    end = text.index("  # every variant must")
    spec.write_text(text[:start] + "  variants:\n    decode_r8_h4096: {rows: 2, hidden: 65536, rpt: 1}\n" + text[end:])
    project.edit("specs/rmsnorm_v2.yaml", '{variants: "large_r16384_*", min_bandwidth_fraction: 0.90}', '{variants: "decode_r8_h4096", max_us: 100}')
    project.edit("specs/rmsnorm_v2.yaml", '    - {variants: "decode_*", max_time_vs_baseline: 1.0}\n', "")
    project.edit("specs/rmsnorm_v2.yaml", '    - {variants: "large_r4096_*",  min_bandwidth_fraction: 0.85}\n', "")
    project.edit("specs/rmsnorm_v2.yaml", '    - {variants: "large_r16384_*", max_time_vs_baseline: 1.08, baseline: compile}\n', "")
    project.edit("specs/rmsnorm_v2.yaml", '    - {variants: "large_*", max_vs_incumbent: 0.5, figure: makespan, incumbent: rmsnorm_hopper}\n', "")
    project.edit("specs/rmsnorm_v2.yaml", "bytes: 64, align: 16", "bytes: 128, align: 16")
    run = project.scons("stage=compile", check=False)
    assert run.returncode != 0
    assert "resource gate failed" in run.stderr and "spills" in run.stderr
    assert not (project.root / "build" / "rmsnorm_v2" / "sm_90a" / "librmsnorm_v2.so").exists()
