"""The local executor's watchdog and crash handling, with tiny stand-in runner modules."""
import time

import pytest

from conftest import stand_in_runners
from mpkbuild.run.job import GateJob
from mpkbuild.run.local import LocalExecutor

RUNNERS = {
    "sleepy": "print('about to spin', flush=True)\nimport time\ntime.sleep(600)\n",
    "dies": "print('CUDA error: an illegal memory access was encountered', flush=True)\nraise SystemExit(3)\n",
    "fine": ("import json, sys\njob = json.load(open(sys.argv[1]))\n"
             "json.dump({'verdict': 'pass', 'message': 'ok'}, open(job['result_file'], 'w'))\n"),
}


@pytest.fixture
def executor(tmp_path, monkeypatch):
    stand_in_runners(tmp_path, "fake_runners", RUNNERS, monkeypatch)

    class Stub(LocalExecutor):
        runner_package = "fake_runners"
    return Stub()


def job(tmp_path, gate, timeout=30.0):
    return GateJob(gate=gate, kernel="k", payload={}, workdir=tmp_path / "work", timeout_s=timeout)


def test_hang_is_killed_with_its_group_and_reported(executor, tmp_path):
    started = time.monotonic()
    result = executor.run(job(tmp_path, "sleepy", timeout=2.0))
    assert time.monotonic() - started < 20
    assert result["verdict"] == "hang"
    assert "2 s timeout" in result["message"] and "about to spin" in result["message"]


def test_death_without_result_is_a_crash_with_the_cuda_text(executor, tmp_path):
    result = executor.run(job(tmp_path, "dies"))
    assert result["verdict"] == "crash"
    assert result["message"].startswith("CUDA error: an illegal memory access was encountered")


def test_result_file_is_read_and_removed(executor, tmp_path):
    j = job(tmp_path, "fine")
    assert executor.run(j)["verdict"] == "pass"
    assert not j.result_file.exists()
