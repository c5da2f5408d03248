"""sanitize=: finding compute-sanitizer, the wrapped command, and reports read into verdicts.

The reports below are in compute-sanitizer's text format (2025.x, as documented and as the
tool printed when run here without a GPU) for what the fault fixtures produce: memcheck on a
store one element past a 2000-byte output, racecheck on a missing __syncthreads(), synccheck
on a divergent barrier, clean runs, and runs where the tool itself never got going."""
import importlib
import os
import stat
import sys

import pytest

from mpkbuild.run import sanitizer

OOB_WRITE = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at fault_oob_small__r5_c100(const float *, float *, unsigned long long *)+0x1b0 in fault_oob_small.cuh:24
=========     by thread (100,0,0) in block (4,0,0)
=========     Access to 0x7f3a5e0007d0 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a5e000000 of size 2,000 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cudaLaunchKernel [0x4f1d3] in libcudart.so.13
=========         Host Frame: fault_oob_small_launch_r5_c100 [0x1a2b] in libfault_oob_small.so
=========
========= ERROR SUMMARY: 1 error
"""

MANY_READS = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at rmsnorm_v2__decode_r8_h4096(const __nv_bfloat16 *, const __nv_bfloat16 *, __nv_bfloat16 *, unsigned long long *)+0x2c0 in rmsnorm_v2.cuh:61
=========     by thread (3,0,0) in block (7,0,0)
=========     Address 0x7f00c2010000 is out of bounds
=========     and is 17 bytes after the nearest allocation at 0x7f00c2000000 of size 65,536 bytes
=========
========= Invalid __global__ read of size 16 bytes
=========     at rmsnorm_v2__decode_r8_h4096(const __nv_bfloat16 *, const __nv_bfloat16 *, __nv_bfloat16 *, unsigned long long *)+0x2c0 in rmsnorm_v2.cuh:61
=========     by thread (4,0,0) in block (7,0,0)
=========     Address 0x7f00c2010010 is out of bounds
=========     and is 33 bytes after the nearest allocation at 0x7f00c2000000 of size 65,536 bytes
=========
========= ERROR SUMMARY: 37 errors
========= ERROR SUMMARY: 2 errors
"""

RACE_ANALYSIS = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at fault_smem_race__r4_c128(const float *, float *, unsigned long long *)+0x150 in fault_smem_race.cuh:23
=========     and Read access at fault_smem_race__r4_c128(const float *, float *, unsigned long long *)+0x1d0 in fault_smem_race.cuh:26 [512 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

# hazard mode, with the summary wrapped onto a second line
RACE_HAZARDS = """\
========= COMPUTE-SANITIZER
========= Error: Potential RAW hazard detected at __shared__ 0x84 in block (2,0,0) :
=========     Write Thread (97,0,0) at fault_smem_race__r4_c128(const float *, float *, unsigned long long *)+0x150 in fault_smem_race.cuh:23
=========     Read Thread (33,0,0) at fault_smem_race__r4_c128(const float *, float *, unsigned long long *)+0x1d0 in fault_smem_race.cuh:26
=========     Current Value : 1065353216
=========
========= RACECHECK SUMMARY: 2 hazards displayed
========= (2 errors, 0 warnings)
"""

RACE_WARNING_ONLY = """\
========= COMPUTE-SANITIZER
========= Warning: Race reported between Write access at reduce__w32(float *)+0x90 in reduce.cuh:12
=========     and Read access at reduce__w32(float *)+0xb0 in reduce.cuh:13 [31 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""

# what compute-sanitizer 2026.4.0 (nvidia-cuda-sanitizer-api 13.5.25) wrote on the H200 for the
# fault_sync_divergent fixture (2026-11-30), cut to its first findings and its summary: the
# location is the inlined task function; only a device frame names the harness kernel
SYNC_DIVERGENT = """\
========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in block.
=========     at void fault_sync_divergent_task<(int)128>(const float *, float *, int, char *)+0x210 in fault_sync_divergent.cuh:23
=========     by thread (32,0,0) in block (0,0,0)
=========         Device Frame: fault_sync_divergent__r4_c128(const float *, float *, unsigned long long *)+0x70 in harness.cu:27
========= 
========= Barrier error detected. Divergent thread(s) in block.
=========     at void fault_sync_divergent_task<(int)128>(const float *, float *, int, char *)+0x210 in fault_sync_divergent.cuh:23
=========     by thread (33,0,0) in block (0,0,0)
=========         Device Frame: fault_sync_divergent__r4_c128(const float *, float *, unsigned long long *)+0x70 in harness.cu:27
========= 
========= ERROR SUMMARY: 224 errors
========= ERROR SUMMARY: 204 errors were not printed. Use --print-limit option to adjust the number of printed errors
"""

CLEAN_MEMCHECK = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
CLEAN_RACECHECK = ("========= COMPUTE-SANITIZER\n"
                   "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
# what compute-sanitizer 2025.3.1 printed here (no GPU driver) for a Python target
NEVER_STARTED = """\
========= COMPUTE-SANITIZER
========= Error: Target application terminated before first instrumented API call
========= Error: couldn't find exit code.
"""
TIMED_OUT = """\
========= COMPUTE-SANITIZER
========= Error: No attachable process found. compute-sanitizer timed-out.
"""
CRASHED_RUNNER = {"verdict": "crash", "message": "CUDA error: unspecified launch failure"}
PASSED_RUNNER = {"verdict": "pass", "message": "all variants pass"}


# ---------------------------------------------------------------- findings
def test_memcheck_write_past_the_end_fails_with_where_and_who():
    res = sanitizer.verdict("memcheck", OOB_WRITE, sanitizer.ERROR_EXITCODE, CRASHED_RUNNER)
    assert res["verdict"] == "fail" and res["check"] == "sanitize:memcheck"
    assert res["errors"] == 1
    msg = res["message"]
    assert msg.startswith("memcheck: 1 error; first: variant r5_c100: "
                          "Invalid __global__ write of size 4 bytes"), msg
    assert "at fault_oob_small__r5_c100+0x1b0 in fault_oob_small.cuh:24" in msg
    assert "by thread (100,0,0) in block (4,0,0)" in msg
    assert "Access to 0x7f3a5e0007d0 is out of bounds" in msg
    assert "1 bytes after the nearest allocation at 0x7f3a5e000000 of size 2,000 bytes" in msg
    assert "Host Frame" not in msg and "const float *" not in msg
    # the runner saw the terminated kernel as a crash; that is kept beside the finding
    assert res["runner"] == CRASHED_RUNNER
    assert "ERROR SUMMARY: 1 error" in res["report_tail"]


def test_memcheck_counts_every_process_and_reports_the_first_finding():
    res = sanitizer.verdict("memcheck", MANY_READS, sanitizer.ERROR_EXITCODE, None)
    assert res["errors"] == 39
    assert res["message"].startswith("memcheck: 39 errors; first: variant decode_r8_h4096: "
                                     "Invalid __global__ read of size 16 bytes")
    assert "by thread (3,0,0) in block (7,0,0)" in res["message"]
    assert len(res["findings"]) == 2 and "thread (4,0,0)" in res["findings"][1]
    assert res.get("runner") is None


def test_racecheck_analysis_names_both_source_lines():
    res = sanitizer.verdict("racecheck", RACE_ANALYSIS, sanitizer.ERROR_EXITCODE, PASSED_RUNNER)
    assert res["verdict"] == "fail" and res["check"] == "sanitize:racecheck"
    msg = res["message"]
    assert msg.startswith("racecheck: 1 race reported (1 error, 0 warnings); first: "
                          "variant r4_c128: Race reported between Write access at "
                          "fault_smem_race__r4_c128+0x150 in fault_smem_race.cuh:23, "
                          "and Read access at fault_smem_race__r4_c128+0x1d0 in "
                          "fault_smem_race.cuh:26 [512 hazards]"), msg
    # the plain run passed; the sanitizer's finding is what fails the gate
    assert res["runner"]["verdict"] == "pass"


def test_racecheck_hazard_mode_and_a_wrapped_summary():
    res = sanitizer.verdict("racecheck", RACE_HAZARDS, sanitizer.ERROR_EXITCODE, PASSED_RUNNER)
    assert res["verdict"] == "fail"
    assert res["message"].startswith("racecheck: 2 races reported (2 errors, 0 warnings); first: "
                                     "variant r4_c128: Potential RAW hazard detected at __shared__ "
                                     "0x84 in block (2,0,0), Write Thread (97,0,0)")
    assert "Read Thread (33,0,0)" in res["message"]


def test_racecheck_warnings_fail_too():
    res = sanitizer.verdict("racecheck", RACE_WARNING_ONLY, sanitizer.ERROR_EXITCODE, PASSED_RUNNER)
    assert res["verdict"] == "fail"
    assert "(0 errors, 1 warning)" in res["message"]
    assert "Race reported between Write access at reduce__w32+0x90" in res["message"]


def test_synccheck_divergent_barrier():
    res = sanitizer.verdict("synccheck", SYNC_DIVERGENT, sanitizer.ERROR_EXITCODE, CRASHED_RUNNER)
    assert res["verdict"] == "fail" and res["check"] == "sanitize:synccheck"
    assert res["errors"] == 224, "the not-printed line repeats errors already counted"
    msg = res["message"]
    assert msg == ("synccheck: 224 errors; first: variant r4_c128: Barrier error detected. "
                   "Divergent thread(s) in block, at void fault_sync_divergent_task<(int)128>"
                   "+0x210 in fault_sync_divergent.cuh:23, by thread (32,0,0) in block (0,0,0)"), msg
    assert "Device Frame" not in msg


def test_a_report_cut_short_still_fails_on_what_it_found():
    cut = OOB_WRITE.split("========= ERROR SUMMARY")[0]
    res = sanitizer.verdict("memcheck", cut, -9, None)
    assert res["verdict"] == "fail" and res["errors"] == 1


def test_application_output_mixed_in_is_ignored():
    mixed = "validate r5_c100 trial 0\n" + OOB_WRITE.replace(
        "=========\n", "=========\nRuntimeError: CUDA error: unspecified launch failure\n", 1)
    res = sanitizer.verdict("memcheck", mixed, sanitizer.ERROR_EXITCODE, CRASHED_RUNNER)
    assert res["errors"] == 1 and "RuntimeError" not in res["message"]


# ---------------------------------------------------------------- nothing found
@pytest.mark.parametrize("tool, report", [("memcheck", CLEAN_MEMCHECK), ("synccheck", CLEAN_MEMCHECK),
                                          ("racecheck", CLEAN_RACECHECK)])
def test_a_clean_report_leaves_the_runner_result_standing(tool, report):
    assert sanitizer.verdict(tool, report, 0, PASSED_RUNNER) is None
    # a clean report does not turn the runner's own failure into a pass either: None means
    # "the runner's result stands", whatever it is
    assert sanitizer.verdict(tool, report, 0, CRASHED_RUNNER) is None


def test_the_runner_failing_on_its_own_is_not_a_sanitizer_finding():
    report = ("========= COMPUTE-SANITIZER\n========= Target application returned an error\n"
              "========= ERROR SUMMARY: 1 error\n")
    assert sanitizer.verdict("memcheck", report, 1, None) is None


def test_error_exit_code_with_a_zero_summary_is_not_a_pass():
    res = sanitizer.verdict("memcheck", CLEAN_MEMCHECK, sanitizer.ERROR_EXITCODE, PASSED_RUNNER)
    assert res["verdict"] == "fail" and "summary counts none" in res["message"]


# ---------------------------------------------------------------- the tool did not run
def test_sanitizer_that_never_attached_is_a_crash_not_a_pass():
    res = sanitizer.verdict("memcheck", NEVER_STARTED, 255, None)
    assert res["verdict"] == "crash" and res["check"] == "sanitize:memcheck"
    assert res["message"] == ("memcheck: compute-sanitizer did not complete (exit code 255): "
                              "Error: Target application terminated before first instrumented "
                              "API call; Error: couldn't find exit code.")


def test_sanitizer_timing_out_on_the_connection():
    res = sanitizer.verdict("racecheck", TIMED_OUT, 255, None)
    assert res["verdict"] == "crash"
    assert "No attachable process found. compute-sanitizer timed-out." in res["message"]


def test_no_report_at_all():
    res = sanitizer.verdict("synccheck", "", 255, None)
    assert res["verdict"] == "crash" and "wrote no report" in res["message"]


def test_a_report_without_summary_is_not_a_pass_even_if_the_runner_passed():
    res = sanitizer.verdict("memcheck", "========= COMPUTE-SANITIZER\n", 0, PASSED_RUNNER)
    assert res["verdict"] == "crash" and "no summary" in res["message"]


def test_runner_failure_is_named_when_the_tool_did_not_complete():
    res = sanitizer.verdict("memcheck", NEVER_STARTED, 255,
                            {"verdict": "crash", "message": "CUDA error: no CUDA-capable device"})
    assert "the runner itself: crash: CUDA error: no CUDA-capable device" in res["message"]


def test_unknown_tool_is_refused():
    with pytest.raises(ValueError, match="memcheck, racecheck, synccheck"):
        sanitizer.verdict("initcheck", CLEAN_MEMCHECK, 0, None)


# ---------------------------------------------------------------- find and wrap
def _fake_binary(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_sanitizer(monkeypatch, tmp_path):
    """No compute-sanitizer anywhere: empty PATH, no wheel, no toolkit."""
    monkeypatch.delenv(sanitizer.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(sanitizer, "_wheel_candidates", lambda: [])
    real = sanitizer._executable
    monkeypatch.setattr(sanitizer, "_executable",
                        lambda p: False if str(p).startswith("/usr/local/cuda") else real(p))
    return tmp_path


def test_find_prefers_the_environment_variable(no_sanitizer, monkeypatch):
    binary = _fake_binary(no_sanitizer / "opt" / "compute-sanitizer")
    monkeypatch.setenv(sanitizer.ENV_VAR, str(binary))
    assert sanitizer.find() == str(binary)


def test_find_refuses_a_bad_environment_variable(no_sanitizer, monkeypatch):
    monkeypatch.setenv(sanitizer.ENV_VAR, str(no_sanitizer / "nothing-here"))
    with pytest.raises(sanitizer.SanitizerMissing, match=sanitizer.ENV_VAR):
        sanitizer.find()


def test_find_uses_path_then_the_wheel(no_sanitizer, monkeypatch):
    wheel_bin = _fake_binary(no_sanitizer / "site" / "nvidia" / "cu13" / "bin" / "compute-sanitizer")
    monkeypatch.setattr(sanitizer, "_wheel_candidates", lambda: [wheel_bin])
    assert sanitizer.find() == str(wheel_bin)
    on_path = _fake_binary(no_sanitizer / "empty-bin" / "compute-sanitizer")
    assert sanitizer.find() == str(on_path)


def _site_with_nvidia(monkeypatch, site):
    """`site` on sys.path, and `nvidia` re-imported from it (a namespace package)."""
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)


def test_wheel_layout_is_found_through_the_nvidia_namespace(monkeypatch, tmp_path):
    site = tmp_path / "site"
    binary = _fake_binary(site / "nvidia" / "cu13" / "bin" / "compute-sanitizer")
    _site_with_nvidia(monkeypatch, site)
    assert binary in sanitizer._wheel_candidates()


def test_the_toolkit_layout_of_newer_wheels_comes_first(monkeypatch, tmp_path):
    """13.4 on: the binary and its TreeLauncher helpers in nvidia/cu13/compute-sanitizer/."""
    site = tmp_path / "site"
    script = _fake_binary(site / "nvidia" / "cu13" / "bin" / "compute-sanitizer")
    binary = _fake_binary(site / "nvidia" / "cu13" / "compute-sanitizer" / "compute-sanitizer")
    _site_with_nvidia(monkeypatch, site)
    found = sanitizer._wheel_candidates()
    assert found.index(binary) < found.index(script)


def test_an_old_wheel_binary_without_its_launcher_is_refused_up_front(no_sanitizer, monkeypatch):
    """13.0.85's bin/compute-sanitizer cannot start a target (no TreeLauncherSubreaper): a
    clear error before any gate, not a crash verdict after the run."""
    binary = _fake_binary(no_sanitizer / "site" / "nvidia" / "cu13" / "bin" / "compute-sanitizer")
    binary.write_bytes(b"\x7fELF" + bytes(60))
    monkeypatch.setattr(sanitizer, "_wheel_candidates", lambda: [binary])
    with pytest.raises(sanitizer.SanitizerMissing, match=r"TreeLauncherSubreaper.*>=13\.4"):
        sanitizer.find()
    (binary.parent / "TreeLauncherSubreaper").write_text("")
    assert sanitizer.find() == str(binary)


def test_find_says_how_to_get_it(no_sanitizer):
    with pytest.raises(sanitizer.SanitizerMissing) as exc:
        sanitizer.find()
    assert "pip install -e .[sanitize]" in str(exc.value)
    assert sanitizer.ENV_VAR in str(exc.value)


def test_find_names_a_binary_that_is_not_executable(no_sanitizer, monkeypatch):
    binary = no_sanitizer / "site" / "nvidia" / "cu13" / "bin" / "compute-sanitizer"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    os.chmod(binary, 0o644)
    monkeypatch.setattr(sanitizer, "_wheel_candidates", lambda: [binary])
    with pytest.raises(sanitizer.SanitizerMissing, match="not executable"):
        sanitizer.find()


def test_wrap_memcheck(no_sanitizer, monkeypatch, tmp_path):
    binary = _fake_binary(no_sanitizer / "empty-bin" / "compute-sanitizer")
    runner = ["/venv/bin/python", "-u", "-m", "mpkbuild.runners.validate", "job.json"]
    cmd = sanitizer.wrap("memcheck", runner, tmp_path / "100%" / "sanitize.log", kernel="fault_oob_small")
    assert cmd[0] == str(binary)
    opts, target = cmd[:cmd.index("--")], cmd[cmd.index("--") + 1:]
    pairs = dict(zip(opts[1::2], opts[2::2]))
    assert pairs["--tool"] == "memcheck"
    assert pairs["--log-file"] == str(tmp_path / "100%%" / "sanitize.log")
    assert pairs["--error-exitcode"] == str(sanitizer.ERROR_EXITCODE)
    assert pairs["--target-processes"] == "all"
    assert pairs["--report-api-errors"] == "no"
    assert pairs["--kernel-name"] == "kns=fault_oob_small__"
    assert int(pairs["--padding"]) > 0
    # every tensor its own cudaMalloc, so a store past one is outside any allocation
    assert target[0].endswith("env") and target[1] == "PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    assert target[2:] == runner


def test_wrap_racecheck_and_synccheck(no_sanitizer, tmp_path):
    _fake_binary(no_sanitizer / "empty-bin" / "compute-sanitizer")
    runner = ["python", "-m", "mpkbuild.runners.validate", "job.json"]
    race = sanitizer.wrap("racecheck", runner, tmp_path / "r.log")
    assert race[race.index("--tool") + 1] == "racecheck"
    assert race[race.index("--racecheck-report") + 1] == "analysis"
    assert "--kernel-name" not in race and "--report-api-errors" not in race
    assert race[race.index("--") + 1:] == runner
    sync = sanitizer.wrap("synccheck", runner, tmp_path / "s.log")
    assert sync[sync.index("--tool") + 1] == "synccheck" and sync[sync.index("--") + 1:] == runner
    with pytest.raises(ValueError, match="sanitize='initcheck'"):
        sanitizer.wrap("initcheck", runner, tmp_path / "i.log")


def test_wrap_without_a_sanitizer_raises_missing(no_sanitizer, tmp_path):
    with pytest.raises(sanitizer.SanitizerMissing):
        sanitizer.wrap("memcheck", ["python"], tmp_path / "m.log")


def _real_sanitizer():
    try:
        return sanitizer.find()
    except sanitizer.SanitizerMissing as exc:
        return pytest.skip(f"needs compute-sanitizer: {exc}")


def test_real_sanitizer_on_a_target_that_never_uses_cuda(tmp_path):
    """End to end with the real binary (no GPU needed): a runner that never initialises CUDA
    is reported by the tool, and the verdict is a crash naming why, never a pass."""
    import subprocess
    _real_sanitizer()
    log = tmp_path / "sanitize.log"
    cmd = sanitizer.wrap("memcheck", [sys.executable, "-c", "print('no CUDA here')"], log)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    report = log.read_text() if log.exists() else ""
    res = sanitizer.verdict("memcheck", report, proc.returncode, None)
    assert res is not None and res["verdict"] == "crash", (res, report, proc.stdout, proc.stderr)
    assert res["check"] == "sanitize:memcheck"
    assert "did not complete" in res["message"], res["message"]
