"""executor=dask against a real dask.distributed LocalCluster (2 worker processes, 1 thread
and GPU=1 each), started in a helper process so scons can be given its address.

The workers see the stand-in nvidia-smi (two "Fake H200") and run the stand-in runners
(MPK_RUNNER_PACKAGE=fake_runners); they have no mpkbuild of their own: every gate brings
the build's mpkbuild in its bundle, and the function that runs it travels by value.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import FAKES, Project, clone_built, copy_project, eventually, process_alive

distributed = pytest.importorskip(
    "distributed", reason="dask.distributed is not installed (pip install -e '.[dask]'); CI installs it")

pytestmark = pytest.mark.nvcc          # the builds compile the kernels for real (sm_90a)
KERNELS = ("rmsnorm_v2", "argmax_v2")
GPU_KEY = "fake-h200-sm90"

# The helper: a GPU cluster and a bare scheduler (no workers); their addresses go to a file;
# it closes both when its stdin closes. Entries holding an mpkbuild package leave sys.path,
# so the spawned workers cannot import ours (an editable install puts it there).
HELPER = r'''
import json, os, sys
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "mpkbuild"))]
from distributed import LocalCluster
if __name__ == "__main__":
    out, scratch = sys.argv[1], sys.argv[2]
    gpu = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"GPU": 1},
                       host="127.0.0.1", dashboard_address=":0", local_directory=scratch)
    bare = LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=":0",
                        local_directory=scratch)
    with open(out + ".tmp", "w") as fh:
        json.dump({"gpu": gpu.scheduler_address, "bare": bare.scheduler_address}, fh)
    os.replace(out + ".tmp", out)
    sys.stdin.read()
    gpu.close()
    bare.close()
'''


@dataclass
class Cluster:
    address: str
    bare: str
    folder: Path

    @property
    def control(self) -> Path:
        return self.folder / "control.json"

    @property
    def pids(self) -> Path:
        return self.folder / "pids.txt"

    def client(self):
        return distributed.Client(self.address, timeout=10, set_as_default=False)

    def scons(self, proj: Project, *args, **kw):
        return proj.scons(*args, "executor=dask", f"scheduler={self.address}", fake_gpu=False, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dask")
    (folder / "helper.py").write_text(HELPER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MPK_", "CUDA_"))}
    env.update(PATH=f"{FAKES / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(FAKES),
               MPK_RUNNER_PACKAGE="fake_runners", MPK_LEASE_DIR=str(folder / "leases"),
               FAKE_RUNNER_PIDS=str(folder / "pids.txt"),
               FAKE_RUNNER_CONTROL=str(folder / "control.json"))
    addr = folder / "addr.json"
    log = open(folder / "cluster.log", "wb")
    proc = subprocess.Popen([sys.executable, str(folder / "helper.py"), str(addr),
                             str(folder / "scratch")], stdin=subprocess.PIPE, stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=folder)
    deadline = time.monotonic() + 90
    while not addr.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the LocalCluster did not start:\n{(folder / 'cluster.log').read_text()[-3000:]}")
        time.sleep(0.1)
    found = json.loads(addr.read_text())
    try:
        yield Cluster(found["gpu"], found["bare"], folder)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def dask_built(cluster, tmp_path_factory) -> tuple[Project, object]:
    """Both kernels built through validate on the cluster (-j2), once for the module."""
    proj = copy_project(tmp_path_factory.mktemp("dask-built") / "proj", kernels=KERNELS)
    run = cluster.scons(proj, "-j2", f"kernel={','.join(KERNELS)}", "stage=validate")
    return proj, run


def result(proj: Project, kernel: str, gate: str = "validate") -> dict:
    return json.loads(proj.path(f"build/{kernel}/gpu/{GPU_KEY}/{gate}.json").read_text())


def test_gates_pass_on_the_workers_with_logs_and_results_back(cluster, dask_built):
    proj, run = dask_built
    assert {f"validate {k} {GPU_KEY}" for k in KERNELS} <= set(run.actions)
    with cluster.client() as client:
        workers = set(client.scheduler_info()["workers"])
        # the gate function travelled by value: no worker ever imported mpkbuild
        seen = client.run(lambda: ("mpkbuild" in sys.modules,
                                   [p for p in sys.path if os.path.isdir(os.path.join(p or ".", "mpkbuild"))]))
    assert all(v == (False, []) for v in seen.values()), seen
    for k in KERNELS:
        res = result(proj, k)
        assert res["verdict"] == "pass", res
        assert res["gpu"]["name"] == "Fake H200" and res["gpu"]["compute_capability"] == "9.0"
        assert res["gpu_signature"].startswith("gpu=Fake H200; cc=9.0; driver=580")
        assert res["worker"] in workers
        fake = res["fake"]
        assert fake["in_bundle"] and not fake["missing"]
        assert fake["mpkbuild"].endswith("_mpk/mpkbuild"), fake["mpkbuild"]   # the bundle's own
        assert f"build/{k}/sm_90a/lib{k}.so" in fake["bundle_files"]
        assert fake["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-fa4e")      # leased there
        log = proj.path(f"build/{k}/gpu/{GPU_KEY}/validate.log").read_text()
        assert f"fake validate {k}" in log
    again = cluster.scons(proj, f"kernel={','.join(KERNELS)}", "stage=validate")
    assert not [a for a in again.actions if a.startswith("validate")]


def test_two_gates_run_side_by_side_on_the_two_workers(cluster, dask_built, tmp_path):
    proj = clone_built(dask_built[0], tmp_path / "proj")
    for k in KERNELS:                       # a validate-only edit: both gates run again
        proj.edit(f"specs/{k}.yaml", "timeout_s: 300", "timeout_s: 301")
    cluster.scons(proj, "-j2", f"kernel={','.join(KERNELS)}", "stage=validate")
    a, b = (result(proj, k) for k in KERNELS)
    assert a["verdict"] == b["verdict"] == "pass"
    assert a["worker"] != b["worker"]
    assert max(a["started_at"], b["started_at"]) < min(a["finished_at"], b["finished_at"]), (a, b)


def test_a_hung_runner_is_killed_by_the_workers_watchdog(cluster, dask_built, tmp_path):
    proj = clone_built(dask_built[0], tmp_path / "proj")
    proj.edit("specs/rmsnorm_v2.yaml", "timeout_s: 300", "timeout_s: 2")
    cluster.control.write_text(json.dumps({"validate": "hang"}))
    try:
        run = cluster.scons(proj, "kernel=rmsnorm_v2", "stage=validate", check=False)
    finally:
        cluster.control.unlink()
    assert run.returncode != 0
    res = result(proj, "rmsnorm_v2")
    assert res["verdict"] == "hang" and "2 s timeout" in res["message"], res
    assert "spinning forever" in res["message"]
    proj.edit("specs/rmsnorm_v2.yaml", "timeout_s: 2", "timeout_s: 3")
    cluster.scons(proj, "kernel=rmsnorm_v2", "stage=validate")      # the GPU is free again
    assert result(proj, "rmsnorm_v2")["verdict"] == "pass"


def test_an_interrupted_build_cancels_its_future(cluster, dask_built, tmp_path):
    proj = clone_built(dask_built[0], tmp_path / "proj")
    proj.edit("specs/rmsnorm_v2.yaml", "timeout_s: 300", "timeout_s: 302")
    cluster.control.write_text(json.dumps({"validate": "hang"}))
    cluster.pids.write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKES), str(proj.root / "site_scons")]))
    scons = subprocess.Popen([sys.executable, "-m", "SCons", "-Q", "kernel=rmsnorm_v2",
                              "stage=validate", "executor=dask", f"scheduler={cluster.address}"],
                             cwd=proj.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while not cluster.pids.read_text().strip():
            assert scons.poll() is None and time.monotonic() < deadline, scons.communicate()[0]
            time.sleep(0.1)
        runner = int(cluster.pids.read_text().split()[0])
        scons.send_signal(signal.SIGINT)
        out = scons.communicate(timeout=30)[0]
    finally:
        cluster.control.unlink()
        if scons.poll() is None:
            scons.kill()
    assert scons.returncode != 0
    assert "interrupted" in out and "nothing was recorded" in out, out
    assert eventually(lambda: not process_alive(runner), timeout=10), \
        "the runner on the worker outlived the cancelled task"
    with cluster.client() as client:
        deadline = time.monotonic() + 10
        while (left := client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.tasks))) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    assert left == []
    assert not proj.path(f"build/rmsnorm_v2/gpu/{GPU_KEY}/validate.json").exists()   # nothing recorded


@pytest.mark.parametrize("which", ["nothing listening", "no GPU workers", "no scheduler file"])
def test_a_bad_scheduler_is_a_clear_error_within_seconds(cluster, tmp_path, which):
    proj = copy_project(tmp_path / "proj")
    arg = {"nothing listening": "scheduler=tcp://127.0.0.1:9",
           "no GPU workers": f"scheduler={cluster.bare}",
           "no scheduler file": f"scheduler_file={tmp_path / 'scheduler.json'}"}[which]
    started = time.monotonic()
    run = proj.scons("kernel=rmsnorm_v2", "stage=validate", "executor=dask", arg,
                     fake_gpu=False, check=False)
    assert time.monotonic() - started < 15
    assert run.returncode != 0
    message = {"nothing listening": "nothing is listening there",
               "no GPU workers": "has no worker with GPU resources",
               "no scheduler file": "scheduler_file="}[which]
    assert message in run.stderr and "nothing was run or recorded" in run.stderr, run.stderr
    if which == "no GPU workers":
        assert "--resources GPU=1" in run.stderr
    assert not list(proj.root.glob("build/*/gpu"))
    assert not run.actions


def test_the_default_install_never_imports_dask():
    code = ("import sys; from mpkbuild import run; run.load(None, {}); "
            "sys.exit(1 if 'distributed' in sys.modules or 'dask' in sys.modules else 0)")
    env = dict(os.environ, PYTHONPATH=str(__import__("conftest").REPO / "site_scons"))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
