"""GPU leases: which GPUs gates may use, one gate per GPU, and no lease outliving its holder."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mpkbuild.run import leases
from mpkbuild.run.leases import Gpu, LeaseError

GPUS = [Gpu(0, "GPU-0000aaaa", "NVIDIA H200"), Gpu(1, "GPU-1111bbbb", "NVIDIA H200"),
        Gpu(2, "GPU-2222cccc", "NVIDIA A100")]


@pytest.fixture(autouse=True)
def lease_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MPK_LEASE_DIR", str(tmp_path / "leases"))
    return tmp_path / "leases"


def test_pick_honours_gpus_and_the_model():
    assert [g.index for g in leases.pick(GPUS, None, "NVIDIA H200")] == [0, 1]
    assert [g.index for g in leases.pick(GPUS, "1", "NVIDIA H200")] == [1]
    assert [g.index for g in leases.pick(GPUS, None, "NVIDIA H200", visible="1,2")] == [1]
    assert [g.index for g in leases.pick(GPUS, None, None, visible="GPU-2222cccc")] == [2]


@pytest.mark.parametrize("wanted, words", [("0,7", ["gpus=0,7", "no GPU 7", "0 (NVIDIA H200)"]),
                                           ("x", ["no GPU x"]), (",", ["empty list"]),
                                           ("2", ["A100", "judged for NVIDIA H200"])])
def test_bad_gpus_lists_are_refused_with_what_exists(wanted, words):
    with pytest.raises(LeaseError) as err:
        leases.pick(GPUS, wanted, "NVIDIA H200")
    for word in words:
        assert word in str(err.value)


def test_exclusive_leases_take_different_gpus_then_wait():
    a = leases.acquire(GPUS[:2])
    b = leases.acquire(GPUS[:2])
    assert {a.gpu.index, b.gpu.index} == {0, 1}
    assert a.env["CUDA_VISIBLE_DEVICES"] == a.gpu.uuid
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 3
    with pytest.raises(leases.Interrupted):
        leases.acquire(GPUS[:2], should_stop=stop)       # both busy: it waits, then gives up
    a.release()
    c = leases.acquire(GPUS[:2])
    assert c.gpu == a.gpu
    b.release()
    c.release()


def test_shared_leases_share_but_never_beside_an_exclusive_one():
    one = [GPUS[0]]
    s1 = leases.acquire(one, shared=True)
    s2 = leases.acquire(one, shared=True)
    with pytest.raises(leases.Interrupted):
        leases.acquire(one, shared=False, should_stop=lambda: True)
    s1.release()
    s2.release()
    ex = leases.acquire(one)
    with pytest.raises(leases.Interrupted):
        leases.acquire(one, shared=True, should_stop=lambda: True)
    ex.release()


def test_a_sigkilled_holder_leaves_no_stale_lease(lease_dir):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from mpkbuild.run import leases
        lease = leases.acquire([leases.Gpu(0, "GPU-0000aaaa", "NVIDIA H200")])
        print("held", flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "MPK_LEASE_DIR": str(lease_dir)})
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(leases.Interrupted):
        leases.acquire([GPUS[0]], should_stop=lambda: True)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    lease = leases.acquire([GPUS[0]], should_stop=lambda: time.monotonic() - started > 5)
    assert lease.gpu.index == 0
    lease.release()


def test_one_nvidia_smi_call_serves_the_fingerprint_and_the_lease_list(tmp_path, monkeypatch):
    """Every scons run reads the GPUs twice (fingerprint, leases): nvidia-smi runs once."""
    from mpkbuild import gpu as gpu_mod
    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {calls}
        printf '0, GPU-0000aaaa, NVIDIA H200, 9.0, 580.159.04\\n1, GPU-1111bbbb, NVIDIA H200, 9.0, 580.159.04\\n'
        """))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fp = gpu_mod.detect()          # (conftest clears the per-process query around each test)
    listed = leases.list_gpus()
    assert (fp.name, fp.compute_capability, fp.driver, fp.count) == ("NVIDIA H200", "9.0", "580.159.04", 1)
    assert listed == [Gpu(0, "GPU-0000aaaa", "NVIDIA H200"), Gpu(1, "GPU-1111bbbb", "NVIDIA H200")]
    assert len(calls.read_text().splitlines()) == 1


def test_the_torch_version_is_read_without_importing_torch():
    from mpkbuild import gpu as gpu_mod
    import importlib.metadata
    code = "import sys; from mpkbuild import gpu; print(gpu._torch_version(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
    try:
        expected = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        expected = "none"
    assert out.stdout.split() == [expected, "False"]
    assert gpu_mod._torch_version() == expected


def test_smi_rows_keep_commas_in_gpu_names():
    """One parser for nvidia-smi's CSV, here and on an ssh host: a name may hold commas."""
    from mpkbuild.gpu import parse_smi
    rows = parse_smi("0, GPU-aaaa, NVIDIA H200, NVL, 9.0, 580.1\nnot a row\n1, GPU-bbbb, NVIDIA H200, 9.0, 580.1\n")
    assert [r["name"] for r in rows] == ["NVIDIA H200, NVL", "NVIDIA H200"]
    assert rows[0]["compute_cap"] == "9.0" and rows[1]["uuid"] == "GPU-bbbb"
