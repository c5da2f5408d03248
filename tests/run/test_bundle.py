"""Job bundles: exactly the gate's inputs and mpkbuild's source travel, the far side runs the
gate under a lease and answers with result and log, and nothing is left behind.

The far side here is this machine, with tests/fakes/bin/nvidia-smi (two "Fake H200") and
the stand-in runners of tests/fakes/fake_runners.
"""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from conftest import assert_processes_gone, eventually, stand_in_tree
from mpkbuild.run.remote import bundle, bootstrap as remote
from mpkbuild.run.job import GateInterrupted, GateJob

from conftest import FAKES


def run_packed(data: bytes, workdir, should_stop=lambda: False) -> dict:
    """The far side as the ssh bootstrap and the dask worker run it: unpack, run, clean up."""
    import shutil
    folder = bundle.unpack(data, workdir)
    try:
        return bundle.run_unpacked(folder, should_stop)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
INPUTS = ("build/k/sm_90a/libk.so", "kernels/k/reference.py")


@pytest.fixture
def tree(tmp_path) -> Path:
    t = stand_in_tree(tmp_path / "tree")
    (t / "specs").mkdir()
    (t / "specs/k.yaml").write_text("kernel: k\n")            # part of the tree, not an input
    (t / "build/k/gpu/x").mkdir(parents=True)
    return t


@pytest.fixture
def far_side(tmp_path, monkeypatch):
    """This process as the GPU machine: fake nvidia-smi, stand-in runners, private leases."""
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(FAKES))
    monkeypatch.setenv("MPK_RUNNER_PACKAGE", "fake_runners")
    monkeypatch.setenv("MPK_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setenv("FAKE_RUNNER_CONTROL", str(tmp_path / "control.json"))
    monkeypatch.setenv("FAKE_RUNNER_PIDS", str(tmp_path / "pids.txt"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path


def make_job(tree: Path, timeout=30.0, **payload_extra) -> GateJob:
    payload = {"root": str(tree), "library": str(tree / INPUTS[0]),
               "codegen": {"codegen": {"threads": 128}},
               "validate": {"validate": {"reference": "kernels/k/reference.py:ref",
                                         "timeout_s": timeout}}, **payload_extra}
    return GateJob("validate", "k", payload, tree / "build/k/gpu/x", timeout, root=tree,
                   inputs=INPUTS)


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_pack_holds_exactly_job_inputs_and_mpkbuild(tree):
    got = members(bundle.pack(make_job(tree)))
    code = {name for name in got if name.startswith("_mpk/")}
    assert set(got) - code == {"job.json", *INPUTS}
    assert code == {name for name, _ in bundle.package_files()}
    assert "_mpk/mpkbuild/runners/validate.py" in code and "_mpk/mpkbuild/templates/harness.cu.j2" in code
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in got)
    for rel in INPUTS:
        assert got[rel] == (tree / rel).read_bytes()


def test_job_json_paths_are_relative_to_the_bundle(tree):
    meta = json.loads(members(bundle.pack(make_job(tree), {"model": "Fake H200"}))["job.json"])
    assert str(tree) not in json.dumps(meta)
    assert meta["payload"]["root"] == "." and meta["payload"]["library"] == INPUTS[0]
    assert sorted(meta["paths"]) == [["library"], ["root"]]
    assert meta["sha256"] == {rel: sha((tree / rel).read_bytes()) for rel in INPUTS}
    assert meta["options"] == {"model": "Fake H200"}


def test_pack_is_deterministic(tree):
    assert bundle.pack(make_job(tree)) == bundle.pack(make_job(tree))


def test_pack_refuses_a_path_outside_the_tree(tree, tmp_path):
    job = make_job(tree, bandwidth_file=str(tmp_path / "elsewhere.json"))
    with pytest.raises(bundle.BundleError, match="outside the tree"):
        bundle.pack(job)


def test_pack_refuses_a_named_file_that_is_not_an_input(tree):
    job = make_job(tree)
    job = GateJob(job.gate, job.kernel, job.payload, job.workdir, job.timeout_s, root=tree,
                  inputs=INPUTS[1:])
    with pytest.raises(bundle.BundleError, match="not among the job's inputs"):
        bundle.pack(job)


def test_pack_refuses_a_missing_input(tree):
    (tree / INPUTS[0]).unlink()
    with pytest.raises(bundle.BundleError, match="does not exist"):
        bundle.pack(make_job(tree))


def test_run_packed_runs_the_shipped_files_under_a_lease(tree, far_side):
    work = far_side / "remote"
    envelope = run_packed(bundle.pack(make_job(tree)), work)
    result = envelope["result"]
    assert result["verdict"] == "pass", result
    fake = result["fake"]
    assert fake["in_bundle"] and not fake["missing"]
    assert {f for f in fake["bundle_files"] if not f.startswith("_mpk/")} == {"job.json", *INPUTS}
    for rel in INPUTS:
        assert fake["shipped"][rel] == sha((tree / rel).read_bytes())
    # the runner imported the bundle's own mpkbuild, not this checkout's
    assert fake["mpkbuild"].startswith(str(work)) and fake["mpkbuild"].endswith("_mpk/mpkbuild")
    assert envelope["gpu_index"] == 0 and fake["env"]["MPK_GPU_INDEX"] == "0"
    assert fake["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-fa4e")
    assert result["device"] == {"name": "Fake H200"}
    assert "fake validate k" in envelope["log"]
    assert list(work.iterdir()) == []                         # the folder is gone


def test_run_packed_without_a_gpu_takes_no_lease(tree, far_side, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_GPUS", "0")
    envelope = run_packed(bundle.pack(make_job(tree)), far_side / "remote")
    assert envelope["gpu_index"] is None and envelope["result"]["verdict"] == "pass"


def test_run_packed_reports_a_gpu_pick_it_cannot_meet(tree, far_side):
    envelope = run_packed(bundle.pack(make_job(tree), {"gpus": "5"}), far_side / "remote")
    assert "gpus=5" in envelope["error"]


def test_apply_envelope_writes_the_log_where_the_local_executor_would(tree, far_side):
    job = make_job(tree)
    envelope = run_packed(bundle.pack(job), far_side / "remote")
    result = bundle.apply_envelope(job, envelope)
    assert result["verdict"] == "pass" and result["gpu_index"] == 0
    assert "fake validate k" in job.log_file.read_text()


def test_a_remote_hang_is_killed_and_reported(tree, far_side):
    (far_side / "control.json").write_text(json.dumps({"validate": "hang"}))
    started = time.monotonic()
    envelope = run_packed(bundle.pack(make_job(tree, timeout=1.5)), far_side / "remote")
    assert time.monotonic() - started < 20
    assert envelope["result"]["verdict"] == "hang"
    assert "spinning" in envelope["result"]["message"]
    assert_processes_gone(runner_pids(far_side))
    assert list((far_side / "remote").iterdir()) == []


def test_should_stop_kills_the_runner_and_interrupts(tree, far_side):
    (far_side / "control.json").write_text(json.dumps({"validate": "hang"}))
    stop = threading.Event()
    threading.Timer(2.0, stop.set).start()
    with pytest.raises(GateInterrupted):
        run_packed(bundle.pack(make_job(tree)), far_side / "remote", should_stop=stop.is_set)
    assert_processes_gone(runner_pids(far_side))
    assert list((far_side / "remote").iterdir()) == []


def runner_pids(folder: Path) -> list[int]:
    path = folder / "pids.txt"
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []



def bootstrap(work: Path, env=None) -> subprocess.Popen:
    """The remote entry point as ssh runs it, minus ssh."""
    return subprocess.Popen([sys.executable, "-c", remote.BOOTSTRAP, str(work)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONHOME"} | (env or {}))


def test_bootstrap_reads_a_framed_bundle_and_answers_with_an_envelope(tree, far_side):
    """As the ssh executor drives it: stdin stays open while the gate runs and after the
    answer; the bootstrap answers, then exits 0 by itself."""
    proc = bootstrap(far_side / "remote")
    proc.stdin.write(remote.frame(bundle.pack(make_job(tree))))
    proc.stdin.flush()
    lines = []
    for line in proc.stdout:                       # until the envelope, stdin still open
        lines.append(line.decode())
        if line.startswith(remote.ENVELOPE_PREFIX.encode()):
            break
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    proc.stdin.close()
    envelope = remote.parse_envelope("".join(lines))
    assert envelope is not None
    assert envelope["result"]["verdict"] == "pass"
    assert list((far_side / "remote").iterdir()) == []


def test_bootstrap_kills_its_runner_when_stdin_closes(tree, far_side):
    (far_side / "control.json").write_text(json.dumps({"validate": "hang"}))
    proc = bootstrap(far_side / "remote")
    proc.stdin.write(remote.frame(bundle.pack(make_job(tree, timeout=300))))
    proc.stdin.flush()
    eventually(lambda: runner_pids(far_side), timeout=30)
    pids = runner_pids(far_side)
    proc.stdin.close()                              # what a dead ssh client looks like
    assert proc.wait(timeout=15) == 3
    assert_processes_gone(pids)
    assert list((far_side / "remote").iterdir()) == []


def test_bootstrap_refuses_a_cut_short_bundle(tree, far_side):
    data = remote.frame(bundle.pack(make_job(tree)))
    proc = bootstrap(far_side / "remote")
    out, err = proc.communicate(data[:-100], timeout=30)
    assert proc.returncode != 0 and b"cut short" in err
