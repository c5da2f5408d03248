"""The fault-injection suite (tests/fixtures/faults): kernels that hang, crash, write out of
bounds, produce NaN, leave output unwritten, compute the wrong thing, race, meet at divergent
barriers, or do not compile.

CPU part: every fixture spec loads; the runner's own compare() says what each numeric fault
must get (the expectations in faultsuite.CASES are pinned to the runner's real wording);
every fixture but fault_compile compiles for sm_90a through real scons; fault_compile fails
with nvcc's file:line and leaves no resources.json.

GPU part (marked `gpu`, run on the GPU box): every case of faultsuite.CASES gets its verdict,
check and message; rmsnorm_v2 validates right after the hang and after the crash on the same
GPU; sanitize= cases skip with the reason when compute-sanitizer is not found."""
import importlib.util
import re
import sys

import pytest
import torch

from mpkbuild.run import sanitizer
from mpkbuild.stages import load_spec

FAULTS_DIR = __import__("conftest").REPO / "tests" / "fixtures" / "faults"
sys.path.insert(0, str(FAULTS_DIR))
import faultsuite  # noqa: E402

from mpkbuild.runners import validate as runner  # noqa: E402  (imports torch; CPU is fine)
from mpkbuild.runners.common import poison_  # noqa: E402

KERNELS = faultsuite.fixture_kernels()
VCFG = {"compare": "tolerance", "cos_min": 0.999, "rel_max": 3e-2}


def _case(name):
    return next(c for c in faultsuite.CASES if c.name == name)


def _reference(kernel, func):
    path = FAULTS_DIR / "kernels" / kernel / "reference.py"
    spec = importlib.util.spec_from_file_location(f"fault_ref_{kernel}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, func)


# ---------------------------------------------------------------- the fixtures as specs
def test_the_suite_covers_every_fixture_and_every_fault_kind():
    assert set(KERNELS) == {c.kernel for c in faultsuite.CASES} - {faultsuite.GATE_AFTER}
    kinds = {c.verdict for c in faultsuite.CASES}
    assert {"hang", "crash", "fail", "pass", "compile-fail"} <= kinds
    assert {c.check for c in faultsuite.CASES if c.check} >= {
        "numeric", "determinism", "sanitize:memcheck", "sanitize:racecheck", "sanitize:synccheck"}
    assert all(c.gate_after for c in faultsuite.CASES if c.verdict in ("hang", "crash"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_fixture_spec_loads(kernel):
    spec = load_spec(FAULTS_DIR / "specs" / f"{kernel}.yaml", FAULTS_DIR)
    assert spec.name == kernel
    assert spec.data["archs"] == ["sm_90a"], "fixtures build for the GPU box only (cheap)"
    assert 1 <= len(spec.data["codegen"]["variants"]) <= 2
    body = FAULTS_DIR / spec.data["codegen"]["body"]
    assert "THE FAULT" in body.read_text(), "each body marks its fault"


def test_hang_fixture_times_out_quickly():
    spec = load_spec(FAULTS_DIR / "specs" / "fault_hang.yaml", FAULTS_DIR)
    assert spec.data["validate"]["timeout_s"] == 20
    assert "ran past its 20 s timeout" in _case("hang").phrases[0]


# ---------------------------------------------------------------- the expected messages
# Emulate each numeric fault on CPU exactly as its body computes it and run the runner's own
# compare(): the phrases the GPU cases expect must be what the runner says.
def _inputs(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _step_message(variant, problem):
    return f"{variant}: trial 0 step 0 output output: {problem}"


def test_nan_fixture_message():
    x = _inputs((4, 256))
    out = 2.0 * x
    out[1, 5] = float("nan")                       # task 1, lane 5
    ref = _reference("fault_nan", "double_reference")(x.to(torch.float64))
    _, problem = runner.compare(out, ref, VCFG)
    assert _step_message("r4_c256", problem) in _case("nan").phrases[0]


def test_unwritten_fixture_message():
    x = _inputs((4, 256))
    out = torch.empty_like(x)
    poison_(out)
    out[:, :-1] = 2.0 * x[:, :-1]                  # c < COLS - 1
    ref = _reference("fault_unwritten", "double_reference")(x.to(torch.float64))
    _, problem = runner.compare(out, ref, VCFG)
    assert _step_message("r4_c256", problem) == _case("unwritten").phrases[0]


@pytest.mark.parametrize("variant, slope, scale, check", [
    ("bad_activation", 1.702, 1.0, "cos"), ("bad_scale", 1.0, 17.0 / 16.0, "rel")])
def test_wrong_fixture_fails_on_the_expected_check(variant, slope, scale, check):
    phrases = _case("wrong").phrases
    for seed in range(5):                          # fresh inputs each trial: robust to them
        x = _inputs((8, 256), seed)
        out = scale * x / (1.0 + torch.exp(-slope * x))
        ref = _reference("fault_wrong", "silu_reference")(x.to(torch.float64))
        numbers, problem = runner.compare(out, ref, VCFG)
        assert problem is not None and problem.startswith(f"{check} "), problem
        if check == "cos":
            assert numbers["cos"] < 0.995          # far from the line, not near it
            assert _step_message(variant, "cos ") == phrases[0] and phrases[1] in problem
        else:
            assert numbers["cos"] > 0.999999
            assert _step_message(variant, problem).startswith(phrases[2])


def test_race_fixture_stays_within_tolerance():
    """Summing in another order moves bits, not the verdict: only determinism can catch it."""
    x = _inputs((4096, 64))
    ref = _reference("fault_race", "column_sum_reference")(x.to(torch.float64))
    forward = x.sum(dim=0)
    backward = torch.zeros(64)
    for r in reversed(range(4096)):
        backward += x[r]
    for out in (forward, backward):
        assert runner.compare(out, ref, VCFG)[1] is None
    assert not torch.equal(forward, backward)


def test_smem_race_reference_is_what_the_body_computes():
    x = _inputs((4, 128))
    ref = _reference("fault_smem_race", "pair_product_reference")(x.to(torch.float64))
    body = x * torch.cat([x[:, 64:], x[:, :64]], dim=1)   # stage[(c + COLS/2) % COLS]
    assert runner.compare(body, ref, VCFG)[1] is None


def test_sync_divergent_reference_is_what_the_body_computes():
    x = _inputs((4, 128))
    ref = _reference("fault_sync_divergent", "half_pair_product_reference")(x.to(torch.float64))
    body = x.clone()
    body[:, :64] = x[:, :64] * torch.cat([x[:, 32:64], x[:, :32]], dim=1)  # stage[(c + 32) % 64]
    assert runner.compare(body, ref, VCFG)[1] is None
    assert not torch.equal(ref[:, :64], x[:, :64].to(torch.float64))     # the exchange matters


def test_oob_small_output_is_not_a_multiple_of_the_allocator_block():
    """The stray store must land in the caching allocator's slack (512-byte blocks), so plain
    validate cannot see it and only memcheck (one cudaMalloc per tensor) can."""
    spec = load_spec(FAULTS_DIR / "specs" / "fault_oob_small.yaml", FAULTS_DIR)
    (v,) = spec.data["codegen"]["variants"].values()
    nbytes = v["rows"] * v["cols"] * 4
    assert nbytes % 512 != 0
    assert v["cols"] < spec.data["codegen"]["threads"]      # a spare thread makes the store
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in sanitizer.MEMCHECK_ENV


# ---------------------------------------------------------------- real scons, no GPU
@pytest.fixture(scope="module")
def fault_build(tmp_path_factory):
    """One compile of every fixture but fault_compile, in one project copy (-j2: CI has 2 cores)."""
    root = faultsuite.make_project(tmp_path_factory.mktemp("faults") / "proj", with_gate_after=False)
    kernels = [k for k in KERNELS if k != "fault_compile"]
    run = faultsuite.scons(root, "-j2", "stage=compile", f"kernel={','.join(kernels)}", timeout=1200)
    return root, kernels, run


@pytest.mark.nvcc
def test_every_fixture_but_one_compiles_for_sm90(fault_build):
    root, kernels, run = fault_build
    assert run.returncode == 0, run.output
    for k in kernels:
        assert f"compile {k} sm_90a" in run.output
        assert (root / "build" / k / "sm_90a" / f"lib{k}.so").is_file()
        resources = (root / "build" / k / "sm_90a" / "resources.json").read_text()
        assert '"verdict": "pass"' in resources


@pytest.mark.nvcc
def test_fault_compile_fails_with_nvccs_file_and_line(fault_build):
    root = fault_build[0]
    run = faultsuite.scons(root, "stage=compile", "kernel=fault_compile", timeout=600)
    out = faultsuite.judge(_case("compile"), root, run)
    assert out.ok, (out.problems, run.output)
    line = faultsuite.compile_line()
    assert f'fault_compile.cuh({line}): error: identifier "scale_factr" is undefined' in run.output
    assert "fault_compile sm_90a" in run.output and "compile.log" in run.output
    assert not (root / "build" / "fault_compile" / "sm_90a" / "libfault_compile.so").exists()
    assert (root / "build" / "fault_compile" / "sm_90a" / "compile.log").is_file()


# ---------------------------------------------------------------- on the GPU box
GPU_CASES = [c for c in faultsuite.CASES if c.stage == "validate"]


@pytest.fixture(scope="module")
def gpu_project(tmp_path_factory):
    return faultsuite.make_project(tmp_path_factory.mktemp("faults-gpu") / "proj")


def _sanitizer_or_skip(case):
    if case.sanitize:
        try:
            sanitizer.find()
        except sanitizer.SanitizerMissing as exc:
            pytest.skip(f"sanitize={case.sanitize}: {exc}")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.name for c in GPU_CASES])
def test_fault_gets_its_verdict_on_the_gpu(gpu_project, case):
    _sanitizer_or_skip(case)
    out = faultsuite.run_case(gpu_project, case)
    assert out.ok, (out.problems, out.message, out.run.output[-3000:])
    if case.verdict != "pass":
        # never recorded as passed, and failures are not cached
        assert not list((gpu_project / "build" / case.kernel / "gpu").glob("*/validate.ok"))
    if case.gate_after:
        after = faultsuite.run_gate_after(gpu_project)
        assert after.ok, (after.problems, after.message, after.run.output[-3000:])
        assert re.search(rf"^validate\s+{faultsuite.GATE_AFTER}\b", after.run.output, re.M), \
            "the gate after really ran"
