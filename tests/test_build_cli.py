"""The command line as users meet it: bad specs, no GPU, failing gates, help, clean, review."""
import json
import shutil

import pytest

K = "rmsnorm_v2"
GPU = "fake-gpu-sm90"


def test_bad_spec_stops_the_build_and_writes_nothing(project):
    project.edit(f"specs/{K}.yaml", "  threads: 128", "  threads: 128\n  colour: blue")
    run = project.scons("stage=compile", check=False)
    assert run.returncode != 0
    assert f"specs/{K}.yaml:11: codegen.colour: unknown field 'colour'" in run.stderr
    assert not (project.root / "build").exists()


def test_unknown_kernel_and_stage_are_refused(project):
    run = project.scons("kernel=nope", check=False)
    assert run.returncode != 0 and "unknown kernel nope" in run.stderr
    run = project.scons("stage=deploy", check=False)
    assert run.returncode != 0 and "unknown stage 'deploy'" in run.stderr
    assert not (project.root / "build").exists()


def test_help_lists_stages_kernels_and_options(project):
    run = project.scons("-h")
    for word in ("spec", "generate", "compile", "validate", "perf", "review", K, "kernel=", "stage="):
        assert word in run.stdout


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                    reason="this machine has a GPU: the no-GPU path is checked on CPU machines")
def test_gpu_stage_without_gpu_fails_and_marks_nothing_passed(project):
    run = project.scons(f"kernel={K}", "stage=validate", fake_gpu=False, check=False)
    assert run.returncode != 0
    assert "needs a CUDA GPU" in run.stderr and "GPU box" in run.stderr
    assert not list((project.root / "build" / K).glob("gpu/*/validate.json"))
    assert not list((project.root / "build" / K).glob("gpu/*/validate.ok"))


@pytest.mark.nvcc
def test_failing_gate_fails_the_run_is_reviewed_and_reruns(built):
    verdicts = json.dumps({"validate": "fail"})
    built.edit(f"specs/{K}.yaml", "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    run = built.scons("stage=review", env={"FAKE_GPU_VERDICT": verdicts}, check=False)
    assert run.returncode != 0
    assert f"validate {K}: fail: stand-in validate said fail" in run.stderr
    result = json.loads((built.root / "build" / K / "gpu" / GPU / "validate.json").read_text())
    assert result["verdict"] == "fail"
    assert not (built.root / "build" / K / "gpu" / GPU / "validate.ok").exists()
    review = (built.root / "build" / K / "review.md").read_text()
    assert "## validate: fail" in review and "## perf: blocked" in review
    assert "validate did not pass" in review
    assert "verdicts:" in run.stdout and "fail: stand-in validate said fail" in run.stdout
    # a failure is never cached: the same inputs run the gate again
    again = built.scons("stage=validate", check=True)
    assert f"validate {K} {GPU}" in again.actions
    assert (built.root / "build" / K / "gpu" / GPU / "validate.ok").exists()


@pytest.mark.nvcc
def test_results_record_the_signatures_they_were_made_from(built):
    result = json.loads((built.root / "build" / K / "gpu" / GPU / "validate.json").read_text())
    inputs = result["inputs"]
    assert inputs["gpu"] == result["gpu_signature"] and "Fake GPU" in inputs["gpu"]
    assert f"build/{K}/spec/validate.json" in inputs and f"build/{K}/sm_90a/resources.json" in inputs
    # the library enters through its hash in resources.json
    resources = json.loads((built.root / "build" / K / "sm_90a" / "resources.json").read_text())
    from mpkbuild.util.fsutil import sha256_file
    assert resources["library_sha256"] == sha256_file(built.root / "build" / K / "sm_90a" / f"lib{K}.so")
    assert f"kernels/{K}/reference.py" in inputs
    assert all(len(v) == 64 for k, v in inputs.items() if not k.startswith(("gpu", "value:")))


@pytest.mark.nvcc
def test_review_pages_show_every_gate(built):
    review = (built.root / "build" / K / "review.md").read_text()
    for section in ("## Compile", "sm_90a resources", "sm_100a resources", "## validate: pass", "## perf: pass"):
        assert section in review
    summary = (built.root / "build" / "review.md").read_text()
    assert f"| {K} | **pass** |" in summary


@pytest.mark.nvcc
def test_clean_removes_build_outputs(built):
    run = built.scons("-c", "stage=review")
    assert not (built.root / "build" / K / "sm_90a" / f"lib{K}.so").exists()
    assert not (built.root / "build" / K / "review.md").exists()
    assert "Could not remove" not in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.nvcc
def test_clean_of_one_kernel_leaves_shared_gpu_nodes(built):
    bandwidth = built.root / "build" / "gpu" / GPU / "bandwidth.json"
    assert bandwidth.exists()
    run = built.scons("-c", f"kernel={K}")
    assert not (built.root / "build" / K / "spec.json").exists()
    assert bandwidth.exists(), run.stdout
    assert "Could not remove" not in run.stdout + run.stderr, run.stdout + run.stderr
    built.scons("-c")                                  # kernel=all: everything goes
    assert not bandwidth.exists()


@pytest.mark.nvcc
@pytest.mark.parametrize("keep_going", [False, True])
def test_a_failed_gate_stops_other_gates_unless_k(tmp_path, keep_going):
    """Gates are handed out before their checks (longest first); a failed verdict still
    stops the run without -k, and with -k every other kernel's gates go on. Exit non-zero."""
    from conftest import copy_project
    proj = copy_project(tmp_path / "proj", kernels=("rmsnorm_v2", "silu_mul_v2"))
    proj.scons("-j2", "stage=compile")
    run = proj.scons(*(["-k"] if keep_going else []), "stage=perf", check=False,
                     env={"FAKE_GPU_VERDICT": json.dumps({"validate:rmsnorm_v2": "fail"})})
    assert run.returncode != 0
    ran = [r for r in proj.runs_file.read_text().splitlines() if not r.startswith("bandwidth")]
    assert ran[0] == "validate rmsnorm_v2"
    if keep_going:
        assert sorted(ran) == ["perf silu_mul_v2", "validate rmsnorm_v2", "validate silu_mul_v2"]
        assert json.loads((proj.root / "build/silu_mul_v2/gpu" / GPU / "perf.json").read_text())["verdict"] == "pass"
        assert json.loads((proj.root / "build/rmsnorm_v2/gpu" / GPU / "perf.json").read_text())["verdict"] == "blocked"
    else:
        assert ran == ["validate rmsnorm_v2"]
        assert "validate silu_mul_v2: not run, validate rmsnorm_v2 did not pass (-k runs every gate)" in run.stderr
        assert not (proj.root / "build/silu_mul_v2/gpu" / GPU / "validate.json").exists()


def test_gpus_naming_a_missing_gpu_is_refused_before_anything_runs(project):
    """gpus= is checked against nvidia-smi (a stand-in with two GPUs here) at start-up."""
    import os
    import time
    from conftest import FAKES
    env = {"PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    started = time.monotonic()
    run = project.scons(f"kernel={K}", "stage=validate", "gpus=0,5", fake_gpu=False,
                        env=env, check=False)
    assert time.monotonic() - started < 30
    assert run.returncode != 0
    assert "gpus=0,5: no GPU 5 on this machine (nvidia-smi lists: 0 (Fake H200), 1 (Fake H200))" in run.stderr
    assert not list(project.root.glob(f"build/{K}/gpu/*/validate.json"))


@pytest.mark.nvcc
def test_verdict_table_lists_what_the_stage_built_and_nothing_else(project):
    run = project.scons("-j2", f"kernel={K}", "stage=perf")
    table = run.stdout.split("verdicts:", 1)[1]
    assert "not reached" not in table
    rows = {line.split()[1]: line for line in table.strip().splitlines()}
    assert "pass" in rows["validate"] and "pass" in rows["perf"]
    assert "compile sm_90a" in table and "compile sm_100a" not in table    # validate runs sm_90a


def test_a_run_of_named_files_says_nothing_of_gates_it_was_not_asked_for(project):
    """`scons build/K/gen/K.cuh` builds that file; the stage's gates were never its targets,
    so the verdict table must not call them stopped by a failure that did not happen."""
    header = f"build/{K}/gen/{K}.cuh"
    run = project.scons(header)
    assert (project.root / header).is_file()
    assert "not reached" not in run.stdout and "first failure" not in run.stdout, run.stdout


@pytest.mark.nvcc
def test_perf_figures_are_judged_by_the_build_against_the_spec(built):
    """Perf runners only time; the build applies the spec's thresholds to the figures, and
    the review shows what each was held to."""
    timed = {"FAKE_GPU_VERDICT": json.dumps({"perf": "timed"})}
    ref = built.path(f"kernels/{K}/reference.py")
    ref.write_text(ref.read_text() + "# the gates run again\n")
    built.scons("stage=review", env=timed)
    perf = json.loads((built.root / "build" / K / "gpu" / GPU / "perf.json").read_text())
    assert perf["verdict"] == "pass" and perf["message"] == "all thresholds met"
    assert perf["variants"]["large_r16384_h7168"]["limits"] == [
        {"variants": "large_r16384_*", "min_bandwidth_fraction": 0.9},
        {"variants": "large_r16384_*", "max_time_vs_baseline": 1.08, "baseline": "compile"}]
    review = (built.root / "build" / K / "review.md").read_text()
    assert "Every variant at or below torch's time (hot)." in review
    assert "| ≥ 90% BW, ≤ 1.08× compile |" in review and "| ≤ 1× torch, ≤ 1× compile |" in review
    ref.write_text(ref.read_text() + "# and again\n")
    run = built.scons("stage=perf", check=False,
                      env={**timed, "FAKE_GPU_RATIO": json.dumps({"decode_r8_h7168": 1.3})})
    assert run.returncode != 0
    perf = json.loads((built.root / "build" / K / "gpu" / GPU / "perf.json").read_text())
    assert perf["verdict"] == "fail"
    assert perf["message"] == ("decode_r8_h7168: 2.60 us is 1.30x the baseline's 2.00 us "
                               "(limit 1.0x; 95% CI 1.286-1.314x, n=21); decode_r8_h7168: 2.60 us "
                               "is 1.30x compile's 2.00 us (limit 1.0x; 95% CI 1.284-1.318x, n=21)")
    assert "perf rmsnorm_v2: fail: decode_r8_h7168: 2.60 us is 1.30x" in run.stdout + run.stderr


@pytest.mark.parametrize("args, nearest", [
    (("sanitise=memcheck", "stage=compile"), "'sanitize'"),
    (("kernal=rmsnorm_v2", "stage=compile"), "'kernel'"),
    (("gpu_hots=me@box", "stage=compile"), "'gpu_host'"),
    (("schedular=tcp://x:1", "stage=compile"), "'scheduler'"),
    (("stauts",), "'status'"),
])
def test_unknown_arguments_and_targets_are_refused_naming_the_nearest(project, args, nearest):
    run = project.scons(*args, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "unknown " in run.stderr and f"did you mean {nearest}?" in run.stderr
    assert not (project.root / "build").exists()


def test_every_argument_an_executor_reads_is_known():
    """ARGUMENT_NAMES is the one list: every name the code reads from the command line is in it."""
    import re
    from pathlib import Path
    from mpkbuild import cli
    src = Path(cli.__file__).parent
    read = set()
    for path in src.rglob("*.py"):
        text = path.read_text()
        read |= set(re.findall(r"ARGUMENTS(?:\.get\(|\[)\s*[\"'](\w+)[\"']", text))
        read |= set(re.findall(r"options\.get\(\s*[\"'](\w+)[\"']", text))
        read |= set(re.findall(r"\bflag\((?:self\.options|ARGUMENTS),\s*[\"'](\w+)[\"']", text))
    read -= {"model"}           # the bundle's own LocalExecutor option, not a command-line one
    assert read and read <= set(cli.ARGUMENT_NAMES), read - set(cli.ARGUMENT_NAMES)


@pytest.mark.parametrize("extra, says", [
    ((), "stage=runtime needs mpk_root=PATH"),
    (("mpk_root=.",), "not an MPK checkout"),
])
def test_stage_runtime_without_a_checkout_is_an_error_and_writes_nothing(project, extra, says):
    """Without mpk_root= the runtime stage could run nothing: an error, not an empty build."""
    for args in (("stage=runtime", *extra), ("status", "stage=runtime", *extra)):
        run = project.scons(*args, check=False)
        assert run.returncode == 2, run.stdout + run.stderr
        assert says in run.stderr, run.stderr
        assert not (project.root / "build").exists()


@pytest.mark.parametrize("args, says", [
    (("stage=valdate",), "did you mean 'validate'?"),
    (("kernel=rmsnorm",), "did you mean 'rmsnorm_v2'?"),
    (("kernel=",), "kernel= names no kernel"),
    (("kernel= , ",), "kernel= names no kernel"),
])
def test_misspelt_or_empty_values_are_refused_with_the_nearest(project, args, says):
    run = project.scons(*args, check=False)
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert not (project.root / "build").exists()


def test_status_names_a_running_build_and_the_lock_names_its_holder(project):
    """While a build holds the tree's lock, status says so; a second build's refusal names
    the holder's pid, or says it cannot when the pid file is gone."""
    import fcntl
    import os
    (project.root / "build").mkdir()
    fd = os.open(project.root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)        # this test process stands in for a running build
    try:
        (project.root / "build" / ".mpk-build.lock").write_text(f"{os.getpid()}\n")
        status = project.scons("status", check=False)
        assert f"a build is running in this tree (pid {os.getpid()})" in status.stdout + status.stderr
        second = project.scons("stage=spec", check=False)
        assert second.returncode == 2 and f"(pid {os.getpid()})" in second.stderr
        (project.root / "build" / ".mpk-build.lock").unlink()
        second = project.scons("stage=spec", check=False)
        assert second.returncode == 2 and "pid file build/.mpk-build.lock is gone" in second.stderr
        assert "pid ?" not in second.stderr
    finally:
        os.close(fd)
