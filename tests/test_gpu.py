"""GPU gates on a real GPU: the shipped kernel passes, and broken bodies get the verdict
they deserve (unwritten output, NaN, state that changes between steps, a CUDA fault, a
hang). Marked `gpu`: skipped with a reason where there is no CUDA GPU; run on the GPU box."""
import statistics

import pytest

from mpkbuild import gpu
from mpkbuild.util import perfspec

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

K = "rmsnorm_v2"
BODY = f"kernels/{K}/{K}.cuh.j2"
STORE = "      for (int i = 0; i < ITERS; ++i) __stcs(out4 + b * ROW + i * THREADS + tid, scale(x[b][i], w[i], inv_rms));"


def only_sm90(project):
    """Build for the GPU here only (faster); the wiring section names both archs, drop it."""
    spec = project.path(f"specs/{K}.yaml")
    text = spec.read_text().replace("archs: [sm_90a, sm_100a]", "archs: [sm_90a]")
    spec.write_text(text[:text.index("\nwiring:")] + "\n")


class LargeShapesBelowTarget(AssertionError):
    """The harness targets the several-rows-a-task large variants miss (and only those)."""


def gpu_name() -> str:
    """The first visible GPU's name (the tool's own nvidia-smi query), or "" without one."""
    found = gpu.detect()
    return found.name if found else ""


# The large variants take several rows a task (the in-runtime verdict's choice: 0.29-0.35x
# MPK's rmsnorm inside MPK). On the H200 that costs r16384 its 90% bandwidth target (89.9%
# cold) and its 1.08x limit against torch.compile (1.12x hot, 1.13x cold; RESULTS sections 22
# and 27); on the H100 every target is met (RESULTS 28), so the expected failure is the H200's.
# Every other assertion holds; the day the H200 meets them this strict expected failure says so.
@pytest.mark.xfail("H200" in gpu_name(), strict=True, raises=LargeShapesBelowTarget,
                   reason="H200: large_r16384_h7168 at 8 rows a task, 89.9% of copy bandwidth "
                          "cold (target 90%) and 1.13x torch.compile cold (limit 1.08x)")
def test_rmsnorm_passes_every_gate_on_this_gpu(project):
    run = project.scons("stage=review", "-k", fake_gpu=False, check=False)
    v = project.gate_result(K, "validate")
    assert v["verdict"] == "pass", v
    assert v["gpu"]["name"] == v["device"]["name"]
    assert v["device"]["wait"] == "blocking_sync"       # no CPU spun beside another gate
    assert v["device"]["work_queues"] == "1"            # contexts made and torn down faster
    assert len(v["variants"]) == 8
    for res in v["variants"].values():
        assert res["cos_min_seen"] >= 0.999 and res["rel_max_seen"] <= 3e-2
        assert len(res["trials"]) == 3
    perf = project.gate_result(K, "perf")
    assert perf["verdict"] in ("pass", "fail"), perf["message"]
    assert not [m for m in perf["problems"] + perf["unsure"] if not m.startswith("large_")], perf["message"]
    assert perf["device"]["wait"] == "blocking_sync"
    assert perf["device"]["work_queues"] == "1"
    assert set(perf["variants"]) == set(v["variants"])
    for res in perf["variants"].values():
        assert res["hot"]["median_us"] > 0 and res["slowcta"]["slowest_task_us"] > 0
        assert res["baseline_hot"]["median_us"] > 0
        for fig in ("hot", "cold"):         # the kernel's and torch's replays were paired
            base = res[f"baseline_{fig}"]
            # hot: within the placement the baseline's comparison is judged on
            kernel, torch_ = perfspec.paired_kernel(res, fig, base)["samples_us"], base["samples_us"]
            # noise-driven sampling: at least `repeats` pairs, more where the spread asks
            assert len(kernel) == len(torch_) >= 7
            assert res[f"vs_baseline_{fig}"] == statistics.median(k / t for k, t in zip(kernel, torch_))
        placements = res["hot_placements"]["placements"]
        assert [e["placement"] for e in placements] == ["fresh", "after_free", "held"]
        assert res["hot"]["median_us"] == max(e["kernel"]["median_us"] for e in placements)
    assert "verdicts:" in run.stdout
    if perf["problems"] or perf["unsure"]:
        raise LargeShapesBelowTarget(perf["message"])
    assert run.returncode == 0, run.stdout[-2000:]


# fault: (its edit of the body, the verdict, a phrase of the message);
# tests/stages/test_gpu_fixtures.py checks on the CPU that each still applies to the body and
# gets through generate
FAULTS = {
    "unwritten": ((STORE, STORE.replace("__stcs(", "if (tid < THREADS / 2) __stcs(")), "fail", "not fully written"),
    "nan": (("const float inv_rms = ", "const float inv_rms = (tid == 5) ? __int_as_float(0x7fc00000) : "),
            "fail", "NaN"),
    "state": (("  float ss = 0.f;", "  __shared__ int bump; if (tid == 0) bump = atomicAdd(&mpk_fault_steps, 1);\n"
                                    "  __syncthreads();  // mpk-lint: allow (the fault under test)\n  float ss = (bump % 2) ? 1.0f : 0.f;"),
              "fail", "differs bitwise between step"),
    "crash": ((STORE, STORE.replace("out4 + b", "out4 + (1ull << 40) + b")), "crash", "illegal"),
    "hang": (("  float ss = 0.f;", "  while (task_index >= 0) __nanosleep(1000);\n  float ss = 0.f;"), "hang", "timeout"),
}


def break_body(project, fault: str) -> None:
    """The fault's edits of the body (the state fault's global first)."""
    if fault == "state":
        # the body lint refuses a __device__ global (state kept across tasks) at generate:
        # allowed here, so that validate's steps are what catches it
        project.edit(BODY, "namespace {{ kernel }}_detail {",
                     "__device__ int mpk_fault_steps;  // mpk-lint: allow (the fault under test)\n"
                     "namespace {{ kernel }}_detail {")
    project.edit(BODY, *FAULTS[fault][0])


@pytest.mark.parametrize("fault, verdict, phrase", [(f, v, p) for f, (_, v, p) in FAULTS.items()])
def test_broken_body_gets_the_right_verdict(project, fault, verdict, phrase):
    only_sm90(project)
    break_body(project, fault)
    project.edit(f"specs/{K}.yaml", "timeout_s: 300", "timeout_s: 20")
    run = project.scons("stage=validate", fake_gpu=False, check=False)
    assert run.returncode != 0
    v = project.gate_result(K, "validate")
    assert v["verdict"] == verdict, v
    assert phrase in v["message"], v["message"]
    assert not list((project.root / "build" / K / "gpu").glob("*/validate.ok"))
    if verdict in ("hang", "crash"):
        # the GPU is usable by the next gate: restore the body and validate again
        old, new = FAULTS[fault][0]
        project.edit(BODY, new, old)
        project.scons("stage=validate", fake_gpu=False)
        assert project.gate_result(K, "validate")["verdict"] == "pass"
