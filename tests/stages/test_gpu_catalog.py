"""GPU gates for the kernel catalog on a real GPU (the H200 box): every kernel validates
(fresh inputs, poison, >= 3 steps, determinism; argmax exactly), the perf gate meets the
spec's thresholds, and the documented edge behaviours have teeth: a body that breaks them
fails validate. Marked `gpu`: skipped with a reason where there is no CUDA GPU."""

import re

import pytest

from mpkbuild.stages.perf.report import dram_figures

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

CATALOG = ("silu_mul_v2", "embedding_v2", "embedding_tokens_v2", "argmax_v2", "argmax_fp32_v2", "linear_v2",
           "linear_residual_v2")


def only_sm90(project, kernel):
    """The spec built for sm_90a alone: its archs, and the per-arch wiring entries that name
    sm_100a (which the spec's check refuses for an arch it does not build)."""
    spec = project.root / f"specs/{kernel}.yaml"
    text = spec.read_text().replace("archs: [sm_90a, sm_100a]", "archs: [sm_90a]")
    spec.write_text(re.sub(r", sm_100a: [^,}]+", "", text))


@pytest.mark.parametrize("kernel", CATALOG)
def test_kernel_validates_on_this_gpu(project_all, kernel):
    project = project_all
    only_sm90(project, kernel)
    run = project.scons(f"kernel={kernel}", "stage=validate", fake_gpu=False, check=False)
    v = project.gate_result(kernel, "validate")
    assert run.returncode == 0 and v["verdict"] == "pass", v.get("message", v)
    for name, res in v["variants"].items():
        assert len(res["trials"]) == 3 and all(t["steps"] >= 3 for t in res["trials"]), name
        if not kernel.startswith("argmax"):
            assert res["cos_min_seen"] >= 0.999 and res["rel_max_seen"] <= 3e-2, (name, res)
    if kernel.startswith("argmax"):
        assert v["limits"]["compare"] == "exact"


@pytest.mark.parametrize("kernel", CATALOG)
def test_kernel_meets_its_perf_thresholds(project_all, kernel):
    project = project_all
    only_sm90(project, kernel)
    run = project.scons(f"kernel={kernel}", "stage=perf", fake_gpu=False, check=False)
    perf = project.gate_result(kernel, "perf")
    table = "\n".join(
        f"{name:28s} hot {r['hot']['median_us']:8.2f} us  torch {r['baseline_hot']['median_us']:8.2f} us  "
        f"x{r['vs_baseline_hot']:.2f}  cold bw {r.get('cold_bandwidth_fraction', float('nan')):.1%}  "
        f"slowCTA {r['slowcta']['slowest_task_us']:.2f} us"
        for name, r in perf.get("variants", {}).items())
    print(f"\n{kernel} perf on {perf.get('device', {}).get('name')}:\n{table}")
    assert run.returncode == 0 and perf["verdict"] == "pass", f"{perf.get('message')}\n{table}"
    above = above_the_ceiling(perf)
    assert not above, above


def above_the_ceiling(perf: dict) -> list[str]:
    """The DRAM figures (the review's: perf.report.dram_figures) whose whole interval lies
    above the measured ceiling of the kernel's mix: a ceiling a kernel exceeds is not one
    (issue 42). The slow end of the median's interval is the lowest bandwidth the samples
    allow."""
    above = []
    for name, r in perf["variants"].items():
        for fig in dram_figures(r):
            slowest = r["bytes"] / (r[fig]["ci_us"][1] * 1e-6)
            if slowest > r["ceiling"]["Bps"]:
                above.append(f"{name} {fig}: {slowest / 1e12:.3f} TB/s at the slow end of its interval, "
                             f"ceiling {r['ceiling']['Bps'] / 1e12:.3f}")
    return above


# the bodies' broken edits, each (file, old, new); tests/stages/test_gpu_fixtures.py checks on
# the CPU that they still apply and get through generate
# the documented behaviour for a bad id is a zero row; gathering (clamped) row 0 instead
ROW_ZERO_FOR_BAD_IDS = [
    ("kernels/embedding_v2/embedding_v2.cuh.j2",
     "for (int i = 0; i < ITERS; ++i) v[b][i] = make_uint4(0u, 0u, 0u, 0u);",
     "for (int i = 0; i < ITERS; ++i) v[b][i] = __ldg(reinterpret_cast<const uint4*>(table) + i * THREADS + tid);")]
# `>=` instead of torch's strict order keeps the LAST of equal maxima (both argmax specs' body)
LAST_OF_TIES = [
    ("kernels/argmax_v2/argmax_v2.cuh.j2", "if (best_idx < 0 || greater(cm, best)) {",
     "if (best_idx < 0 || greater(cm, best) || cm == best) {"),
    ("kernels/argmax_v2/argmax_v2.cuh.j2", "            if (same(Vec<T>::at(v[u], k), cm)) j = k;",
     "            if (same(Vec<T>::at(v[u], k), cm)) { j = k; break; }")]


def test_embedding_gate_catches_a_body_that_reads_row_zero_for_bad_ids(project_all):
    project, k = project_all, "embedding_v2"
    only_sm90(project, k)
    for edit in ROW_ZERO_FOR_BAD_IDS:
        project.edit(*edit)
    run = project.scons(f"kernel={k}", "stage=validate", fake_gpu=False, check=False)
    v = project.gate_result(k, "validate")
    assert run.returncode != 0 and v["verdict"] == "fail", v
    assert "large_r16384_h7168" in v["message"]


@pytest.mark.parametrize("k", ("argmax_v2", "argmax_fp32_v2"))
def test_argmax_gate_catches_highest_index_ties(project_all, k):
    # the last of equal maxima: exact compare fails, in bf16 (ties from its coarse spacing)
    # and in fp32 (ties from the generator's step)
    project = project_all
    only_sm90(project, k)
    for edit in LAST_OF_TIES:
        project.edit(*edit)
    run = project.scons(f"kernel={k}", "stage=validate", fake_gpu=False, check=False)
    v = project.gate_result(k, "validate")
    assert run.returncode != 0 and v["verdict"] == "fail", v
    assert "exact compare" in v["message"]
