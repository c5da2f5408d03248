"""Issue 58's targets on a real GPU: the TMA pipeline linears, the residual linear and the
gate|up projection with the norm and silu_mul fused (rmsnorm_linear_silu_mul_v2) through
validate, perf and the runtime gate in the pinned MPK checkout, their thresholds being the
issue's targets (0.8x MPK's task inside MPK at every shape, the MLP block 0.85x MPK's chain;
the harness at most 1.0x cuBLAS cold). Not met today: each kernel's test is a strict expected failure that names the numbers,
raised only by missed thresholds -- a crash, a hang, wrong numerics or a variant without a
result fail it outright -- so the day a kernel meets its targets the suite says so.
Marked `gpu`: skipped with a reason where there is no CUDA GPU; `bench/gpu_box.sh OUT targets`."""
import os

import pytest

from conftest import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

PINNED = REPO.parent / "shared" / "mirage" / "mpk"


class TargetsUnmet(AssertionError):
    """The kernel ran every gate soundly and missed only thresholds (issue 58's targets)."""


# the figures the targets were missed by (bench/RESULTS.md sections 34-47)
MISSED = {
    "linear_v2": "in-runtime 0.73-0.83x linear_swapAB_hopper on the H200 (section 37; 0.81-0.83x "
                 "at n4096 and n28672, large 0.80x with its interval across 0.8; target 0.8x "
                 "at every shape, its interval below), 0.81-0.97x on the H100 (section 38); "
                 "the MLP block as we build it (silu_mul in the gate|up epilogue) 0.87 / 0.89 / "
                 "0.87x MPK's chain at b1 / b8 / b16 on the H100 with the checkout's events "
                 "(section 47; target 0.85x), not yet run on the H200; harness at 82.6% / 84.9% "
                 "of the read ceiling at m16 / m8 n14336 on the H200 (85%)",
    "linear_residual_v2": "in-runtime 0.85-0.94x linear_swapAB_with_residual_hopper on the H100 "
                          "(section 34; target 0.8x at every shape); its harness targets are met",
    "rmsnorm_linear_silu_mul_v2": "in-runtime 0.75 / 0.78 / 0.85x MPK's three tasks at m16 / m8 / m1 "
                                  "and 1.0x at large (the read ceiling) on the H100 (sections 41, 45; "
                                  "target 0.8x); harness 83.0% / 84.3% of the read ceiling at m16 / "
                                  "m1 (85%; m1 before its kf 2 fills)",
}


@pytest.mark.parametrize("kernel", [
    pytest.param(k, marks=pytest.mark.xfail(strict=True, raises=TargetsUnmet, reason=why))
    for k, why in MISSED.items()])
def test_linear_meets_issue_58s_targets_in_the_harness_and_inside_mpk(project_all, kernel):
    if not (PINNED / "include").is_dir():
        pytest.skip("../shared/mirage (the pinned MPK tree) is absent")
    project = project_all
    # both archs' variants compile side by side (the box has the cores; the GPU gates queue)
    run = project.scons(f"kernel={kernel}", "stage=review", f"mpk_root={PINNED}", "-k",
                        f"-j{os.cpu_count() or 2}", fake_gpu=False, check=False)
    validate = project.gate_result(kernel, "validate")
    assert validate["verdict"] == "pass", validate["message"]
    judged = {gate: project.gate_result(kernel, gate) for gate in ("perf", "runtime")}
    missed = []
    for gate, res in judged.items():
        # judged: every variant ran soundly (numerics against the incumbent included), so what
        # is left is thresholds
        assert res["verdict"] in ("pass", "fail", "unsure") and "problems" in res, (gate, res["message"])
        assert not [p for p in res["problems"] if "no result" in p], res["problems"]
        missed += [f"{gate}: {p}" for p in res["problems"] + res.get("unsure", [])]
    runtime = judged["runtime"]
    assert set(runtime["variants"]) >= set(validate["variants"])
    for name, r in runtime["variants"].items():
        assert r["iterations"] >= 3 and r["head_to_head"]["incumbents"], name
    if missed:
        raise TargetsUnmet("\n".join(missed))
    assert run.returncode == 0, run.stdout[-2000:]
