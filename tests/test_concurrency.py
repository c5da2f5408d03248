"""Two builds in one tree, and builds killed mid-gate: nothing corrupt, nothing trusted."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import FAKES

pytestmark = pytest.mark.nvcc

K = "rmsnorm_v2"
GPU = "fake-gpu-sm90"


def start(project, *args, sleep="30"):
    project.runs_file.unlink(missing_ok=True)     # wait_for_gate watches for a fresh line
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    env.update(PYTHONPATH=os.pathsep.join([str(FAKES), str(project.root / "site_scons")]
                                          + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               FAKE_GPU_RUNS=str(project.runs_file), FAKE_GPU_SLEEP=sleep)
    return subprocess.Popen([sys.executable, "-m", "SCons", "-Q", *args, "executor=fake_gpu:FakeGpuExecutor"],
                            cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_for_gate(project, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if project.runs_file.exists() and "validate" in project.runs_file.read_text():
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
