"""Two builds in one tree, and builds killed mid-gate: nothing corrupt, nothing trusted."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import FAKES

pytestmark = pytest.mark.nvcc

K = "rmsnorm_v2"
GPU = "fake-gpu-sm90"


def start(project, *args, sleep="30", sleep_gate=None):
    project.runs_file.unlink(missing_ok=True)     # wait_for_gate watches for a fresh line
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    env.update(PYTHONPATH=os.pathsep.join([str(FAKES), str(project.root / "site_scons")]
                                          + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               FAKE_GPU_RUNS=str(project.runs_file), FAKE_GPU_SLEEP=sleep)
    if sleep_gate:
        env["FAKE_GPU_SLEEP_GATE"] = sleep_gate
    return subprocess.Popen([sys.executable, "-m", "SCons", "-Q", *args, "executor=fake_gpu:FakeGpuExecutor"],
                            cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_for_gate(project, proc, timeout=120, gate="validate"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if project.runs_file.exists() and f"{gate} " in project.runs_file.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("the gate never started")


def test_second_build_refuses_while_one_runs(built):
    built.edit(f"specs/{K}.yaml", "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    first = start(built, "stage=validate")
    try:
        wait_for_gate(built, first)
        second = built.scons("stage=validate", check=False)
        assert second.returncode != 0
        assert f"another scons is building in this tree (pid {first.pid})" in second.stderr
        # reading commands do not wait for the lock
        assert built.scons("status").returncode == 0
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_build_killed_mid_gate_leaves_nothing_trusted(built, sig):
    result = built.root / "build" / K / "gpu" / GPU / "validate.json"
    before = json.loads(result.read_text())["finished"]
    built.edit(f"specs/{K}.yaml", "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    proc = start(built, "stage=validate")
    wait_for_gate(built, proc)
    os.killpg(proc.pid, sig)
    proc.wait(timeout=20)     # the 30 s stand-in gate was stopped, not waited for
    # the old result is either untouched or gone; never a half-written or new-looking one
    if result.exists():
        assert json.loads(result.read_text())["finished"] == before
    # status calls it stale, and the next build (the lock died with its holder) redoes it
    nodes = {n["label"]: n for n in json.loads(built.scons("status", "--json").stdout)["nodes"]}
    assert nodes[f"validate {K} {GPU}"]["will_run"]
    run = built.scons("stage=validate")
    assert f"validate {K} {GPU}" in run.actions
    assert json.loads(result.read_text())["finished"] != before


def test_sigint_to_scons_alone_says_the_build_was_interrupted(built):
    """^C reaches scons (not its gate's process group): the running gate is stopped, nothing
    later starts, and the output says so instead of calling the rest "not reached" for a
    failure that never happened."""
    built.edit(f"specs/{K}.yaml", "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    proc = start(built, "stage=perf", sleep_gate="validate")
    wait_for_gate(built, proc)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "the build was interrupted; the stand-in gate stopped; nothing was recorded" in err
    assert "mpk: the build was interrupted (SIGINT or SIGTERM)" in out
    assert re.search(rf"{K}\s+perf\s+not reached \(the build was interrupted\)", out), out
    assert "stopped at the first failure" not in out
    assert "perf " not in built.runs_file.read_text()


KILLS = {"SIGKILL in validate": ("validate", signal.SIGKILL), "SIGINT in validate": ("validate", signal.SIGINT),
         "SIGKILL in perf": ("perf", signal.SIGKILL), "SIGINT in perf": ("perf", signal.SIGINT)}


@pytest.mark.parametrize("case", list(KILLS))
def test_after_a_kill_dry_run_status_check_and_build_agree(built, case):
    """After each kind of kill: -n, status and check name the same nodes, the next build
    runs exactly those, and no finished gate is called hand-edited."""
    gate, sig = KILLS[case]
    built.edit(f"kernels/{K}/reference.py", '"""Called with float64', '"""Called (edited) with float64')
    proc = start(built, "stage=review", sleep_gate=gate)
    wait_for_gate(built, proc, gate=gate)
    os.killpg(proc.pid, sig)
    proc.wait(timeout=20)
    dry = built.scons("-n", "stage=review")
    predicted = set(dry.stdout.split("\n")) - {""}
    status = built.scons("status", "--json")
    nodes = json.loads(status.stdout)["nodes"]
    assert predicted == {n["label"] for n in nodes if n["will_run"]}
    assert f"{gate} {K} {GPU}" in predicted
    check = built.scons("check", f"gpu={GPU}", check=False)
    assert check.returncode == 1
    listed = {line.split(":")[0].strip() for line in check.stderr.splitlines() if line.startswith("  ")}
    assert listed == {n["label"] for n in nodes if n["will_run"] and n["kind"] in ("gate", "compile", "wire")}
    run = built.scons("stage=review")
    executed = set(run.actions)
    assert executed == predicted, f"-n {sorted(predicted)} != executed {sorted(executed)}"
    for out in (dry.stdout + dry.stderr, status.stderr, check.stderr, run.stdout):
        assert "modified after its gate wrote it" not in out, out
    assert {n["label"] for n in json.loads(built.scons("status", "--json").stdout)["nodes"]
            if n["will_run"]} == set()


def test_clean_waits_for_no_one_it_refuses_while_a_build_runs(built):
    """`scons -c` takes the build lock too (it used to remove files under a running build);
    and the lock holds when its pid file is deleted."""
    built.edit(f"specs/{K}.yaml", "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    first = start(built, "stage=validate")
    try:
        wait_for_gate(built, first)
        clean = built.scons("-c", check=False)
        assert clean.returncode != 0, clean.stdout
        assert f"another scons is building in this tree (pid {first.pid})" in clean.stderr
        assert (built.root / "build" / K / "spec.json").exists()
        (built.root / "build" / ".mpk-build.lock").unlink()
        second = built.scons("stage=validate", check=False)
        assert second.returncode != 0 and "another scons is building in this tree" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert built.scons("-c").returncode == 0        # the lock died with its holder


def test_orphaned_temporary_files_are_removed_by_the_next_build(built):
    dead = subprocess.Popen(["true"])
    dead.wait()
    gpu_dir = built.root / "build" / K / "gpu" / GPU
    lib_dir = next(p for p in (built.root / "build" / K).iterdir() if p.name.startswith("sm_"))
    orphans = [lib_dir / f".lib{K}.so.{dead.pid}.tmp", gpu_dir / f".validate.json.{dead.pid}-k2j4_x.tmp"]
    live = gpu_dir / f".perf.json.{os.getpid()}-abc123.tmp"      # a writer still alive: kept
    for p in orphans + [live]:
        p.write_text("half-written")
    assert built.scons("stage=review").actions == []
    assert not any(p.exists() for p in orphans)
    assert live.exists()


def test_piping_a_build_into_head_ends_quietly(built):
    built.edit(f"kernels/{K}/reference.py", '"""Called with float64', '"""Called (edited) with float64')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    env.update(PYTHONPATH=os.pathsep.join([str(FAKES), str(built.root / "site_scons")]
                                          + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.Popen([sys.executable, "-m", "SCons", "-Q", "stage=review",
                             "executor=fake_gpu:FakeGpuExecutor"], cwd=built.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                              # `| head -0`: the reader is gone
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 0, err
