"""The warm runner server and the local executor's leases, with stand-in runners and a
stand-in nvidia-smi (no GPU needed): forks per gate, crash isolation, hang kill, a killed
client's gate killed too, and -j2 on two GPUs running side by side."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import eventually, process_alive, stand_in_runners
from mpkbuild.run import warm
from mpkbuild.run.job import GateJob
from mpkbuild.run.local import LocalExecutor

RUNNERS = {
    # top-level code runs per gate (runpy); 'torch' already imported means a warm start
    "fine": """
import json, os, sys, time
warm = 'torch' in sys.modules
job = json.load(open(sys.argv[1]))
started = time.time()
time.sleep(job.get('sleep', 0))
print('fine runner', os.getpid(), flush=True)
json.dump({'verdict': 'pass', 'message': 'ok', 'warm': warm, 'pid': os.getpid(),
           'visible': os.environ.get('CUDA_VISIBLE_DEVICES'), 'started': started,
           'ended': time.time(),
           'preloaded': sorted(m for m in sys.modules if m.startswith('stand_in_runners.'))},
          open(job['result_file'], 'w'))
""",
    # the server imports these once (as real runners, they act only as __main__)
    "validate": "import runpy\nif __name__ == '__main__':\n    runpy.run_module('stand_in_runners.fine', run_name='__main__')\n",
    "perf": "import runpy\nif __name__ == '__main__':\n    runpy.run_module('stand_in_runners.fine', run_name='__main__')\n",
    "dies": "print('CUDA error: an illegal memory access was encountered', flush=True)\nimport os\nos._exit(3)\n",
    "sleepy": """
import json, os, sys, time
job = json.load(open(sys.argv[1]))
open(job['pid_file'], 'w').write(str(os.getpid()))
print('about to spin', flush=True)
time.sleep(600)
""",
}

SMI = """#!/bin/sh
# stand-in nvidia-smi: two H200s
case "$*" in
  *index,uuid,name,compute_cap,driver_version*)
    printf '0, GPU-0000aaaa, NVIDIA H200, 9.0, 580.1\\n1, GPU-1111bbbb, NVIDIA H200, 9.0, 580.1\\n' ;;
  *) exit 2 ;;
esac
"""



@pytest.fixture
def stage(tmp_path, monkeypatch):
    stand_in_runners(tmp_path, "stand_in_runners", RUNNERS, monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    short = Path(tempfile.mkdtemp(prefix="mpkw"))      # unix socket paths must stay short
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPK_LEASE_DIR", str(short))
    monkeypatch.setenv("MPK_RUNNER_PACKAGE", "stand_in_runners")
    monkeypatch.setenv("MPK_WARM_IDLE_S", "20")
    yield tmp_path
    subprocess.run(["pkill", "-9", "-f", str(short)], check=False)
    shutil.rmtree(short, ignore_errors=True)


def job(tmp_path, gate, timeout=60.0, name="w", **payload):
    return GateJob(gate=gate, kernel="k", payload=payload, workdir=tmp_path / name, timeout_s=timeout)


def test_warm_server_forks_a_fresh_child_per_gate(stage):
    first = warm.run(job(stage, "fine"), "GPU-0000aaaa", {}, lambda: False)
    second = warm.run(job(stage, "fine"), "GPU-0000aaaa", {}, lambda: False)
    assert first["verdict"] == second["verdict"] == "pass"
    assert first["warm"] and second["warm"]          # torch was imported before the gate ran
    assert first["pid"] != second["pid"]             # a fresh process per gate
    assert "fine runner" in (stage / "w" / "fine.log").read_text()


def test_the_server_imports_the_jobs_runners_once_and_never_others(stage):
    """preload (stages.runner_names for the build's jobs): those modules are imported in the
    server before it forks; a runner that acts on import ("dies") is never imported there."""
    first = warm.run(GateJob(gate="fine", kernel="k", payload={}, workdir=stage / "p", timeout_s=60.0,
                             preload=("validate", "perf")), "GPU-0000aaaa", {}, lambda: False)
    assert first["verdict"] == "pass"
    assert {"stand_in_runners.validate", "stand_in_runners.perf"} <= set(first["preloaded"])
    assert "stand_in_runners.dies" not in first["preloaded"]
    crash = warm.run(job(stage, "dies"), "GPU-0000aaaa", {}, lambda: False)
    assert crash["verdict"] == "crash"            # in its child; the server goes on
    assert warm.run(job(stage, "fine"), "GPU-0000aaaa", {}, lambda: False)["verdict"] == "pass"


def test_a_crashing_gate_takes_down_only_its_child(stage):
    crash = warm.run(job(stage, "dies"), "GPU-0000aaaa", {}, lambda: False)
    assert crash["verdict"] == "crash"
    assert crash["message"].startswith("CUDA error: an illegal memory access")
    after = warm.run(job(stage, "fine"), "GPU-0000aaaa", {}, lambda: False)
    assert after["verdict"] == "pass" and after["warm"]


def test_a_hanging_gate_is_killed_and_the_server_goes_on(stage):
    started = time.monotonic()
    hang = warm.run(job(stage, "sleepy", timeout=3.0, pid_file=str(stage / "pid")),
                    "GPU-0000aaaa", {}, lambda: False)
    assert hang["verdict"] == "hang" and "about to spin" in hang["message"]
    assert time.monotonic() - started < 30
    pid = int((stage / "pid").read_text())
    assert eventually(lambda: not process_alive(pid), timeout=5)
    assert warm.run(job(stage, "fine"), "GPU-0000aaaa", {}, lambda: False)["verdict"] == "pass"


@pytest.mark.parametrize("warm_flag", ["1", "0"])
def test_a_killed_build_leaves_no_runner_behind(stage, warm_flag):
    """SIGKILL the process that runs the gate: its runner dies too, and the GPU is free."""
    pid_file = stage / "pid"
    client = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from mpkbuild.run.job import GateJob
        from mpkbuild.run.local import LocalExecutor
        j = GateJob(gate="sleepy", kernel="k", payload={{"pid_file": {str(pid_file)!r}}},
                    workdir=Path({str(stage / 'c')!r}), timeout_s=600)
        LocalExecutor({{"warm": {warm_flag!r}}}).run(j)
        """)])
    assert eventually(pid_file.exists, timeout=60)
    runner = int(pid_file.read_text())
    assert process_alive(runner)
    client.send_signal(signal.SIGKILL)
    client.wait()
    assert eventually(lambda: not process_alive(runner), timeout=10), \
        "the runner outlived the build that started it"
    result = LocalExecutor({"warm": warm_flag, "gpus": "0"}).run(job(stage, "fine"))
    assert result["verdict"] == "pass" and result["lease_wait_s"] < 5


def _run_two(executor, stage, share=False):
    results = [None, None]

    def go(i):
        j = job(stage, "fine", name=f"j{i}", sleep=2.0)
        if share:
            from dataclasses import replace
            j = replace(j, share_gpu=True)
        results[i] = executor.run(j)
    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("warm_flag", ["1", "0"])
def test_two_gates_run_side_by_side_on_two_gpus(stage, warm_flag):
    a, b = _run_two(LocalExecutor({"warm": warm_flag}), stage)
    assert {a["visible"], b["visible"]} == {"GPU-0000aaaa", "GPU-1111bbbb"}
    assert {a["gpu_index"], b["gpu_index"]} == {0, 1}
    assert a["started"] < b["ended"] and b["started"] < a["ended"]       # they overlapped


def test_gpus_limits_the_set_and_one_gpu_serialises(stage):
    a, b = _run_two(LocalExecutor({"warm": "0", "gpus": "1"}), stage)
    assert a["visible"] == b["visible"] == "GPU-1111bbbb"
    first, second = sorted([a, b], key=lambda r: r["started"])
    assert second["started"] >= first["ended"] - 0.05                    # never two on one GPU


def test_bad_gpus_fails_before_any_gate(stage):
    from mpkbuild.run.job import ExecutorError
    with pytest.raises(ExecutorError, match=r"gpus=0,5: no GPU 5 .*0 \(NVIDIA H200\), 1 \(NVIDIA H200\)"):
        LocalExecutor({"gpus": "0,5"}).fingerprint()


def test_gates_that_may_share_a_gpu_run_together_on_one(stage):
    a, b = _run_two(LocalExecutor({"warm": "0", "gpus": "0"}), stage, share=True)
    assert a["visible"] == b["visible"] == "GPU-0000aaaa"
    assert a["started"] < b["ended"] and b["started"] < a["ended"]


def test_the_tests_stop_the_warm_servers_their_projects_started(tmp_path):
    """conftest.stop_warm_servers: a server runs in its build's folder; one started from
    the project is stopped, one started elsewhere is not."""
    from conftest import stop_warm_servers
    inside, outside = tmp_path / "proj" / "sub", tmp_path / "elsewhere"
    inside.mkdir(parents=True)
    outside.mkdir()
    stand_in = "import time; time.sleep(60)  # mpkbuild.run.warm"
    procs = [subprocess.Popen([sys.executable, "-c", stand_in], cwd=d) for d in (inside, outside)]
    try:
        time.sleep(0.2)
        assert stop_warm_servers(tmp_path / "proj") == [procs[0].pid]
        assert procs[0].wait(timeout=10) == -signal.SIGTERM
        assert procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
