"""The profile stage: Nsight Compute's report read into each variant's figures, the bound
each variant is classified as against the measured ceilings, the spec's expected bounds
judged, a machine whose counters ncu cannot read said so (never passed), and the stage
through scons with the stand-in GPU: its node, -n, status, review and an edit's re-run."""
import importlib.util
import json

import pytest

from conftest import FAKES, REPO, clone_built, copy_project
from mpkbuild.model.spec import SpecError
from mpkbuild.run.job import ToolMissing
from mpkbuild.stages import load_spec
from mpkbuild.stages.profile import judge, ncu

_spec = importlib.util.spec_from_file_location("fake_gpu", FAKES / "fake_gpu.py")
fake_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_gpu)
FLOOR_NS, MEMORY_BOUND, ncu_report = fake_gpu.FLOOR_NS, fake_gpu.MEMORY_BOUND, fake_gpu.ncu_report
CEILINGS = {"copy_bandwidth_Bps": 4.0e12, "ceilings_Bps": {"1:1": 4.0e12, "2:1": 4.2e12, "read": 4.4e12}}
RULES = {"bound_at": 0.6, "launch_factor": 2.0, "expect": []}
SPEC = "specs/linear_v2.yaml"
EXPECT = '{variants: "*", bound: memory}'


def launched(kernel, names):
    return {"verdict": "launched", "kernel": kernel, "launched": list(names), **CEILINGS}


def profiled(variants: dict, rules=RULES, floor_ns=FLOOR_NS):
    res = ncu.finish("ncu", ncu_report("k", variants, floor_ns), 0, launched("k", variants))
    assert res["verdict"] == "profiled", res
    return judge.judge(res, rules, list(variants))


def test_the_raw_page_is_read_per_launch_with_units_and_thousands_separators():
    text = ncu_report("linear_v2", {"large_m16": {**MEMORY_BOUND, "duration_ns": 123456.5}})
    rows, messages = ncu.parse(text)
    assert messages == ["==PROF== Connected to process 4242 (python3)"]
    floor, row = rows
    assert floor["kernel"] == "spin_kernel" and floor["duration_ns"] == FLOOR_NS
    assert row["kernel"] == "linear_v2__large_m16" and row["duration_ns"] == 123456.5   # "123,456.5"
    assert row["dram_read_bytes"] == 18e6 and row["sm_pct"] == 30.0
    assert row["stalls"] == {"barrier": 0.4, "long_scoreboard": 5.2}     # "selected" is no stall


def test_what_ncu_wrote_on_the_h200_is_read_and_judged():
    """ncu 2025.x on the H200 (2026-12-05), linear_v2's three profiled shapes: the raw page
    holds every metric it collected (device attributes too), names in demangled signatures
    ("at::<unnamed>::spin_kernel(long)"), units "ns" and "byte", thousands separators."""
    text = (REPO / "tests/fixtures/profile/ncu_linear_v2_h200.txt").read_text()
    shapes = ["decode_m16_n14336_k4096", "decode_m1_n4096_k4096", "large_m1_n28672_k8192"]
    ceilings = {"copy_bandwidth_Bps": 4.2587e12, "ceilings_Bps": {"1:1": 4.2587e12, "2:1": 4.4390e12, "read": 4.6851e12}}
    res = ncu.finish("ncu", text, 0, {"verdict": "launched", "kernel": "linear_v2", "launched": shapes, **ceilings})
    assert res["verdict"] == "profiled" and res["floor_ns"] == 1568.0
    large = res["variants"]["large_m1_n28672_k8192"]
    assert (large["duration_ns"], large["dram_read_bytes"], large["grid"]) == (107552.0, 469798656.0, 1792.0)
    judged = judge.judge(res, {**RULES, "expect": [{"variants": "*", "bound": "memory"}]}, shapes)
    assert judged["verdict"] == "pass", judged["message"]
    assert [round(judged["variants"][v]["dram_of_ceiling"], 2) for v in shapes] == [0.78, 0.63, 0.94]
    assert judged["variants"]["decode_m16_n14336_k4096"]["top_stalls"][0]["reason"] == "long_scoreboard"


def test_a_signature_is_reduced_to_the_functions_own_name():
    assert ncu.function_name("at::<unnamed>::spin_kernel(long)") == "spin_kernel"
    assert ncu.function_name("void ns::k__v<128, (int)3>(float *, int)") == "k__v"
    assert ncu.function_name("linear_v2__large(const __nv_bfloat16 *, unsigned long long *)") == "linear_v2__large"


@pytest.mark.parametrize("figures, bound, why", [
    (MEMORY_BOUND, "memory", "DRAM at 90% of the measured 1:1 ceiling"),
    # 36 MB read in 10 us: 3.6 TB/s is 82% of the 4.4 TB/s read-only ceiling
    ({**MEMORY_BOUND, "dram_read_bytes": 36e6, "dram_write_bytes": 0}, "memory", "82% of the measured read ceiling"),
    ({**MEMORY_BOUND, "dram_read_bytes": 1e6, "dram_write_bytes": 0, "sm_pct": 75.0}, "compute", "SM throughput at 75%"),
    ({**MEMORY_BOUND, "dram_read_bytes": 1e6, "dram_write_bytes": 1e6, "sm_pct": 20.0}, "latency", "both under 60%"),
    ({**MEMORY_BOUND, "duration_ns": 2900}, "launch", "2.90 µs is within 2× the empty kernel's 1.50 µs"),
])
def test_each_variant_is_classified_against_the_measured_ceilings(figures, bound, why):
    v = profiled({"v": figures})["variants"]["v"]
    assert v["bound"] == bound and why in v["why"], v
    assert v["top_stalls"][0] == {"reason": "long_scoreboard", "warps_per_issue": 5.2}


def test_without_a_launch_floor_no_variant_is_called_launch_bound():
    v = profiled({"v": {**MEMORY_BOUND, "duration_ns": 2900}}, floor_ns=None)
    assert v["floor_ns"] is None and v["variants"]["v"]["bound"] == "memory"


def test_a_variant_not_bound_as_the_spec_expects_fails_the_gate_and_says_why():
    rules = {**RULES, "expect": [{"variants": "large_*", "bound": "memory"},
                                 {"variants": "decode_*", "bound": ["launch", "latency"]}]}
    res = profiled({"large_a": {**MEMORY_BOUND, "sm_pct": 20.0, "dram_read_bytes": 1e6, "dram_write_bytes": 0},
                    "decode_b": {**MEMORY_BOUND, "duration_ns": 2000}}, rules)
    assert res["verdict"] == "fail"
    assert res["problems"] == ["large_a: expected memory-bound, measured latency-bound (DRAM 2% of "
                               "its ceiling and SM 20% of peak, both under 60%)"]
    assert res["variants"]["decode_b"]["expected"] == ["launch", "latency"]
    assert profiled({"large_a": MEMORY_BOUND, "decode_b": {**MEMORY_BOUND, "duration_ns": 2000}},
                    rules)["verdict"] == "pass"


@pytest.mark.parametrize("said", [
    "==ERROR== Failed to initialize the profiler: LibraryNotLoaded",
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
    "Counters on the target device 0.",
])
def test_counters_ncu_cannot_read_make_the_gate_unavailable_with_ncus_words(said):
    text = f"==PROF== Connected to process 77 (python3)\n{said}\n==WARNING== No kernels were profiled.\n"
    res = ncu.finish("ncu", text, 1, launched("k", ["a"]))
    assert res["verdict"] == "unavailable"
    assert res["message"] == f"ncu could not read the hardware counters on this machine: {said}"
    assert judge.judge(res, RULES, ["a"]) is res          # never judged, never passed


def test_a_variant_ncu_wrote_no_row_for_is_unavailable_and_named():
    text = ncu_report("k", {"a": MEMORY_BOUND})
    res = ncu.finish("ncu", text, 0, launched("k", ["a", "b"]))
    assert res["verdict"] == "unavailable" and res["message"].startswith("ncu measured no launch of b")


def test_a_runner_that_crashed_under_ncu_keeps_its_verdict_and_gets_ncus_errors():
    crash = {"verdict": "crash", "message": "CUDA error 700"}
    res = ncu.finish("ncu", "==ERROR== The application returned an error code (1).\n", 1, crash)
    assert res["verdict"] == "crash" and res["ncu_errors"] == ["==ERROR== The application returned an error code (1)."]


def test_the_runner_runs_under_ncu_with_only_its_kernels_and_the_empty_one_profiled(tmp_path, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MPK_NCU", str(fake))
    cmd = ncu.wrap("ncu", ["python", "-m", "runner", "job.json"], tmp_path / "r.txt", "linear_v2")
    assert cmd[0] == str(fake) and cmd[-5:] == ["--", "python", "-m", "runner", "job.json"]
    assert cmd[cmd.index("--kernel-name") + 1] == r"regex:^(spin_kernel|linear_v2__[A-Za-z0-9_]+)$"
    assert cmd[cmd.index("--log-file") + 1] == str(tmp_path / "r.txt")
    assert cmd[cmd.index("--clock-control") + 1] == "none"      # the clocks as they are
    monkeypatch.setenv("MPK_NCU", str(tmp_path / "nowhere"))
    with pytest.raises(ToolMissing, match="MPK_NCU="):
        ncu.find()


def test_a_glob_that_matches_no_variant_is_refused_at_load(tmp_path):
    p = copy_project(tmp_path / "proj", kernels=None)
    p.edit(SPEC, "large_*]", "huge_*]")
    with pytest.raises(SpecError) as info:
        load_spec(p.path(SPEC), p.root)
    line = next(i for i, ln in enumerate(p.path(SPEC).read_text().splitlines(), 1) if "huge_*" in ln)
    assert (info.value.line, info.value.path) == (line, ("profile", "variants", 2))
    assert info.value.message == "'huge_*' matches no variant"


@pytest.fixture(scope="module")
def profiled_project(tmp_path_factory):
    p = copy_project(tmp_path_factory.mktemp("profile") / "proj", kernels=None)
    p.scons("-j2", "kernel=linear_v2", "stage=profile")
    return p


def test_the_stage_profiles_after_validate_and_the_review_shows_each_bound(profiled_project, tmp_path):
    p = clone_built(profiled_project, tmp_path / "proj")
    res = p.gate_result("linear_v2", "profile")
    assert res["verdict"] == "pass" and res["message"] == "3 variants profiled: 3 memory-bound"
    assert sorted(res["variants"]) == ["decode_m16_n14336_k4096", "decode_m8_n4096_k4096", "large_m1_n28672_k8192"]
    assert not p.scons("-n", "kernel=linear_v2", "stage=profile").actions
    # a kernel whose spec asks for no profile has no profile node
    assert not [a for a in p.scons("-n", "kernel=rmsnorm_v2", "stage=profile").actions if a.startswith("profile")]
    p.scons("kernel=linear_v2", "stage=review", check=False)
    page = p.path("build/linear_v2/review.md").read_text()
    assert "## profile: pass" in page
    profile = page.split("## profile: pass")[1]
    row = next(ln for ln in profile.splitlines() if ln.startswith("| large_m1_n28672_k8192 |"))
    assert row.startswith("| large_m1_n28672_k8192 | memory | 10.00 | 3.60 TB/s (90%) | 30% | 70% | "
                          "long_scoreboard 5.20, barrier 0.40")
    status = {n["label"]: n for n in json.loads(p.scons("status", "--json", "kernel=linear_v2").stdout)["nodes"]}
    assert status["profile linear_v2 fake-gpu-sm90"]["state"] == "fresh"


def test_an_expectation_edit_rejudges_only_the_profile_and_a_miss_fails_it(profiled_project, tmp_path):
    p = clone_built(profiled_project, tmp_path / "proj")
    p.edit(SPEC, EXPECT, '{variants: "large_*", bound: compute}')
    listed = p.scons("-n", "kernel=linear_v2", "stage=profile").actions
    assert [a for a in listed if not a.startswith("spec")] == ["profile linear_v2 fake-gpu-sm90"], listed
    run = p.scons("kernel=linear_v2", "stage=profile", check=False)
    assert run.returncode != 0
    res = p.gate_result("linear_v2", "profile")
    assert res["verdict"] == "fail" and res["problems"][0].startswith(
        "large_m1_n28672_k8192: expected compute-bound, measured memory-bound (DRAM at 90%")


def test_where_ncu_cannot_read_counters_the_stage_says_so_and_is_not_passed(profiled_project, tmp_path):
    p = clone_built(profiled_project, tmp_path / "proj")
    report = tmp_path / "ncu.txt"
    report.write_text("==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n")
    p.edit(SPEC, EXPECT, '{variants: "large_*", bound: memory}')
    run = p.scons("kernel=linear_v2", "stage=profile", check=False, env={"FAKE_GPU_TOOL_REPORT": str(report)})
    assert run.returncode != 0 and "ncu could not read the hardware counters on this machine" in run.stderr
    assert p.gate_result("linear_v2", "profile")["verdict"] == "unavailable"
    # not passed, so never cached: the next build profiles again
    assert "profile linear_v2 fake-gpu-sm90" in p.scons("-n", "kernel=linear_v2", "stage=profile").actions


@pytest.mark.gpu
@pytest.mark.nvcc
def test_linear_v2_profiles_on_the_gpu_as_its_spec_expects(tmp_path):
    """ncu on the H200: every profiled linear_v2 shape is memory-bound, as its spec says."""
    p = copy_project(tmp_path / "proj", kernels=None)
    p.edit(SPEC, "archs: [sm_90a, sm_100a]", "archs: [sm_90a]")
    run = p.scons("kernel=linear_v2", "stage=profile", fake_gpu=False, check=False, timeout=900)
    res = p.gate_result("linear_v2", "profile")
    assert res["verdict"] == "pass", (res.get("message"), run.stdout[-2000:], run.stderr[-2000:])
    for name, v in res["variants"].items():
        assert v["us"] > 0 and v["dram_Bps"] > 0 and v["top_stalls"], (name, v)
