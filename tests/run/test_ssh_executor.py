"""The ssh backend against a real OpenSSH server on 127.0.0.1 (a free port, a throwaway key
pair, its own host key and sshd_config in a temporary folder).

The "remote" is this machine: sshd's SetEnv puts tests/fakes/bin first on PATH (a fake
nvidia-smi listing two "Fake H200") and selects the stand-in runners (fake_runners), which
report exactly which files reached them. Skipped when /usr/sbin/sshd is absent; .ci/run
installs openssh-server, so CI runs these.
"""
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Project, assert_processes_gone, clone_built, copy_project, eventually, stand_in_tree
from mpkbuild.run.job import ExecutorError, GateInterrupted, GateJob
from mpkbuild.run.remote.ssh import SshExecutor

SSHD = "/usr/sbin/sshd"
from conftest import FAKES
K = "rmsnorm_v2"
KEY = "fake-h200-sm90"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """A running sshd and what a client needs to reach it."""

    def __init__(self, folder: Path):
        self.dir = folder
        self.user = getpass.getuser()
        self.port = _free_port()
        self.control = folder / "control.json"
        self.pids = folder / "pids.txt"
        self.remote_work = folder / "remote-work"
        for name in ("host_key", "client_key", "stranger_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                            "-f", str(folder / name)], check=True)
        shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
        (folder / "known_hosts").write_text(
            f"[127.0.0.1]:{self.port} {(folder / 'host_key.pub').read_text()}")
        path = os.pathsep.join([str(FAKES / "bin"), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
        setenv = {"PATH": path, "PYTHONPATH": str(FAKES), "MPK_RUNNER_PACKAGE": "fake_runners",
                  "MPK_LEASE_DIR": str(folder / "leases"), "FAKE_RUNNER_CONTROL": str(self.control),
                  "FAKE_RUNNER_PIDS": str(self.pids)}
        (folder / "sshd_config").write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_key'}",
            f"PidFile {folder / 'sshd.pid'}", f"AuthorizedKeysFile {folder / 'authorized_keys'}",
            "StrictModes no", "UsePAM no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password", "MaxStartups 50",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in setenv.items()), ""]))
        check = subprocess.run([SSHD, "-t", "-f", str(folder / "sshd_config")], capture_output=True, text=True)
        if check.returncode != 0:
            pytest.skip(f"sshd refuses the test config: {check.stderr.strip()}")
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(folder / "sshd_config"),
                                      "-E", str(folder / "sshd.log")])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        pytest.skip(f"sshd did not start: {(folder / 'sshd.log').read_text()[-500:]}")

    def ssh_opts(self, key="client_key", port=None) -> str:
        return (f"-F /dev/null -p {port or self.port} -i {self.dir / key} -o IdentitiesOnly=yes "
                f"-o UserKnownHostsFile={self.dir / 'known_hosts'} -o StrictHostKeyChecking=yes")

    def options(self, **over) -> dict:
        opts = {"gpu_host": f"{self.user}@127.0.0.1", "ssh_opts": self.ssh_opts(),
                "gpu_python": sys.executable, "gpu_workdir": str(self.remote_work)}
        opts.update(over)
        return opts

    def args(self, **over) -> list[str]:
        return [f"{k}={v}" for k, v in self.options(**over).items()]

    def runner_pids(self) -> list[int]:
        return [int(ln.split()[0]) for ln in self.pids.read_text().splitlines()] if self.pids.exists() else []

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def sshd_server(tmp_path_factory):
    if not os.path.exists(SSHD):
        pytest.skip(f"no OpenSSH server ({SSHD}): `apt-get install -y --no-install-recommends "
                    "openssh-server` (.ci/run does it in CI)")
    if not Path("/run/sshd").is_dir():
        try:
            os.makedirs("/run/sshd", mode=0o755)      # sshd's privilege-separation folder
        except OSError as exc:
            pytest.skip(f"sshd needs /run/sshd and it cannot be made here: {exc}")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def sshd(sshd_server):
    """The server with a clean control file, pid list and remote work folder per test."""
    for path in (sshd_server.control, sshd_server.pids):
        path.unlink(missing_ok=True)
    shutil.rmtree(sshd_server.remote_work, ignore_errors=True)
    return sshd_server


# ---------------------------------------------------------------- the executor itself
@pytest.fixture
def tree(tmp_path) -> Path:
    return stand_in_tree(tmp_path / "tree")


def make_job(tree: Path, timeout=30.0) -> GateJob:
    payload = {"root": str(tree), "library": str(tree / "build/k/sm_90a/libk.so"),
               "validate": {"validate": {"reference": "kernels/k/reference.py:ref", "timeout_s": timeout}}}
    return GateJob("validate", "k", payload, tree / "build/k/gpu/x", timeout, root=tree,
                   inputs=("build/k/sm_90a/libk.so", "kernels/k/reference.py"))



def remote_leftovers(sshd) -> list:
    return list(sshd.remote_work.iterdir()) if sshd.remote_work.exists() else []


def test_fingerprint_is_the_remote_gpu(sshd):
    import torch
    fp = SshExecutor(sshd.options()).fingerprint()
    assert (fp.name, fp.compute_capability, fp.driver, fp.count) == ("Fake H200", "9.0", "580.1", 2)
    assert fp.torch == torch.__version__ and fp.key == KEY


def test_gpus_option_is_checked_against_the_remote_box(sshd):
    assert SshExecutor(sshd.options(gpus="1")).fingerprint().count == 1
    with pytest.raises(ExecutorError, match="gpus=7"):
        SshExecutor(sshd.options(gpus="7")).fingerprint()


def test_a_gate_runs_remotely_and_its_result_and_log_come_back(sshd, tree):
    job = make_job(tree)
    result = SshExecutor(sshd.options()).run(job)
    assert result["verdict"] == "pass", result
    assert result["device"] == {"name": "Fake H200"} and result["gpu_index"] in (0, 1)
    fake = result["fake"]
    assert {f for f in fake["bundle_files"] if not f.startswith("_mpk/")} == {"job.json", *job.inputs}
    assert fake["root"].startswith(str(sshd.remote_work))
    assert "fake validate k" in job.log_file.read_text()
    assert remote_leftovers(sshd) == []


def test_a_remote_crash_comes_back_with_the_cuda_text(sshd, tree):
    sshd.control.write_text(json.dumps({"validate": "crash"}))
    result = SshExecutor(sshd.options()).run(make_job(tree))
    assert result["verdict"] == "crash"
    assert result["message"].startswith("CUDA error: an illegal memory access")


def test_a_remote_hang_is_killed_and_reported(sshd, tree):
    sshd.control.write_text(json.dumps({"validate": "hang"}))
    started = time.monotonic()
    job = make_job(tree, timeout=2.0)
    result = SshExecutor(sshd.options()).run(job)
    assert time.monotonic() - started < 30
    assert result["verdict"] == "hang", result
    assert "2 s timeout" in result["message"] and "spinning" in result["message"]
    assert "spinning" in job.log_file.read_text()
    assert_processes_gone(sshd.runner_pids(), what="remote runner")
    assert remote_leftovers(sshd) == []


def test_interrupt_kills_ssh_and_the_remote_runner(sshd, tree):
    sshd.control.write_text(json.dumps({"validate": "hang"}))
    stop = threading.Event()

    def stop_when_running():
        eventually(sshd.runner_pids, timeout=30)
        stop.set()
    threading.Thread(target=stop_when_running, daemon=True).start()
    with pytest.raises(GateInterrupted):
        SshExecutor(sshd.options()).run(make_job(tree, timeout=300), should_stop=stop.is_set)
    assert_processes_gone(sshd.runner_pids(), what="remote runner")
    eventually(lambda: not remote_leftovers(sshd), timeout=10)
    assert remote_leftovers(sshd) == []


def test_a_killed_ssh_client_stops_the_remote_runner(sshd, tree, monkeypatch):
    """What a SIGKILLed build leaves: its ssh client dies, the remote sees EOF on stdin."""
    sshd.control.write_text(json.dumps({"validate": "hang"}))
    ex = SshExecutor(sshd.options())
    ex.fingerprint()                     # probed before the spy: the only Popen left is the gate's
    clients = []
    real_popen = subprocess.Popen

    def spy(*a, **kw):
        proc = real_popen(*a, **kw)
        clients.append(proc)
        return proc
    monkeypatch.setattr(subprocess, "Popen", spy)
    done = {}
    t = threading.Thread(target=lambda: done.update(r=_run_catching(ex, make_job(tree, timeout=300))),
                         daemon=True)
    t.start()
    eventually(sshd.runner_pids, timeout=30)
    assert clients and sshd.runner_pids()
    os.killpg(clients[0].pid, signal.SIGKILL)
    t.join(30)
    assert isinstance(done.get("r"), ExecutorError), done     # the run says the link broke
    assert_processes_gone(sshd.runner_pids(), what="remote runner")


def _run_catching(ex, job):
    try:
        return ex.run(job)
    except Exception as exc:       # noqa: BLE001 (the test inspects it)
        return exc


@pytest.mark.parametrize("case", ["closed port", "refused key", "wrong python", "unknown host key"])
def test_bad_configuration_fails_within_seconds_with_what_to_fix(sshd, case):
    over, expect = {
        "closed port": ({"ssh_opts": sshd.ssh_opts(port=_free_port())}, "cannot reach the host"),
        "refused key": ({"ssh_opts": sshd.ssh_opts(key="stranger_key")}, "refused the key"),
        "wrong python": ({"gpu_python": "/nonexistent/python3"}, "gpu_python=/nonexistent/python3: not found"),
        "unknown host key": ({"ssh_opts": sshd.ssh_opts().replace(str(sshd.dir / "known_hosts"), "/dev/null")},
                             "host key is not known"),
    }[case]
    started = time.monotonic()
    with pytest.raises(ExecutorError, match=expect):
        SshExecutor(sshd.options(**over)).fingerprint()
    assert time.monotonic() - started < 5


def test_missing_gpu_host_is_a_configuration_error():
    with pytest.raises(ExecutorError, match="gpu_host="):
        SshExecutor({"executor": "ssh"})


def test_a_remote_without_gpus_has_no_fingerprint_and_says_why(sshd):
    ex = SshExecutor(sshd.options(gpu_python=f"env FAKE_SMI_GPUS=0 {sys.executable}"))
    assert ex.fingerprint() is None
    assert "nvidia-smi lists no GPU" in ex.absence() and "127.0.0.1" in ex.absence()


# ---------------------------------------------------------------- real scons builds
@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Project:
    """rmsnorm_v2 compiled (nvcc), no GPU gate run yet: each test takes a private copy."""
    proj = copy_project(tmp_path_factory.mktemp("compiled") / "proj")
    proj.scons(f"kernel={K}", "stage=compile")
    return proj


@pytest.fixture
def proj(compiled, tmp_path) -> Project:
    return clone_built(compiled, tmp_path / "proj")


def gpu_results(proj: Project) -> list:
    return sorted(p.relative_to(proj.root) for p in proj.root.glob("build/*/gpu/**/*") if p.is_file())


@pytest.mark.nvcc
def test_scons_validate_on_the_remote_box(sshd, proj):
    run = proj.scons(f"kernel={K}", "stage=validate", *sshd.args(), fake_gpu=False)
    assert f"validate {K} {KEY}" in " | ".join(run.actions) or any(a.startswith(f"validate {K}") for a in run.actions)
    gpu_dir = proj.path(f"build/{K}/gpu/{KEY}")
    result = json.loads((gpu_dir / "validate.json").read_text())
    assert result["verdict"] == "pass" and result["gpu"]["name"] == "Fake H200"
    assert result["gpu"]["count"] == 2
    assert "fake validate rmsnorm_v2" in (gpu_dir / "validate.log").read_text()
    shipped = {f: h for f, h in result["fake"]["shipped"].items() if not f.startswith("_mpk/")}
    expected = {f"build/{K}/sm_90a/lib{K}.so", f"kernels/{K}/reference.py"}
    assert set(shipped) == {"job.json", *expected}
    import hashlib
    for rel in expected:
        assert shipped[rel] == hashlib.sha256(proj.path(rel).read_bytes()).hexdigest()
    # nothing changed: the second run does nothing
    again = proj.scons(f"kernel={K}", "stage=validate", *sshd.args(), fake_gpu=False)
    assert not [a for a in again.actions if a.startswith("validate")]


@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["closed port", "refused key", "wrong python"])
def test_scons_with_a_bad_gpu_host_fails_fast_and_records_nothing(sshd, proj, case):
    over, expect = {
        "closed port": ({"ssh_opts": sshd.ssh_opts(port=_free_port())}, "cannot reach the host"),
        "refused key": ({"ssh_opts": sshd.ssh_opts(key="stranger_key")}, "refused the key"),
        "wrong python": ({"gpu_python": "/nonexistent/python3"}, "not found"),
    }[case]
    started = time.monotonic()
    run = proj.scons(f"kernel={K}", "stage=validate", *sshd.args(**over), fake_gpu=False, check=False)
    elapsed = time.monotonic() - started
    assert run.returncode != 0
    assert expect in run.stdout + run.stderr
    assert elapsed < 15, elapsed
    assert gpu_results(proj) == []
    assert not [a for a in run.actions if a.startswith("validate")]


@pytest.mark.nvcc
def test_scons_remote_hang_is_recorded_as_hang(sshd, proj):
    proj.edit(f"specs/{K}.yaml", "timeout_s: 300", "timeout_s: 2")
    sshd.control.write_text(json.dumps({"validate": "hang"}))
    run = proj.scons(f"kernel={K}", "stage=validate", *sshd.args(), fake_gpu=False, check=False)
    assert run.returncode != 0
    result = json.loads(proj.path(f"build/{K}/gpu/{KEY}/validate.json").read_text())
    assert result["verdict"] == "hang" and "2 s timeout" in result["message"]
    assert_processes_gone(sshd.runner_pids(), what="remote runner")


@pytest.mark.nvcc
def test_scons_remote_that_fails_mid_gate_stops_with_a_message_and_records_nothing(sshd, proj, tmp_path):
    """The probe works, the gate's ssh call does not (the box fell over): no traceback, no result."""
    python = tmp_path / "python-that-falls-over"
    python.write_text(f"#!/bin/sh\ncase \"$*\" in *MPK-BUNDLE*) echo 'box fell over' >&2; exit 5;; esac\n"
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    run = proj.scons(f"kernel={K}", "stage=validate", *sshd.args(gpu_python=str(python)),
                     fake_gpu=False, check=False)
    assert run.returncode != 0
    assert "the remote side ended with status 5 without an answer" in run.stdout + run.stderr
    assert "box fell over" in run.stdout + run.stderr and "Traceback" not in run.stderr
    assert not [p for p in gpu_results(proj) if p.suffix == ".json"]
