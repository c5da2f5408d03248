"""Gate processes wait for the GPU asleep and open one work queue (runners/gpuwait.py): the
flag is set before the context exists, and a context made before it is left alone."""
import os
import subprocess
import sys

import pytest

from mpkbuild.runners import gpuwait

PROBE = """
import sys, torch
from mpkbuild.runners import gpuwait
early = {early}
if early:
    set_count = gpuwait.block_while_waiting()
torch.empty(1, device="cuda")
late = gpuwait.block_while_waiting()
print(set_count if early else "-", late, gpuwait.wait_mode(0))
"""


def probe(early: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(early=early)], check=True,
                         capture_output=True, text=True, env={**os.environ,
                                                              "CUDA_VISIBLE_DEVICES": "0"})
    return out.stdout.split()


@pytest.mark.gpu
def test_flag_set_before_the_context_makes_it_block():
    assert probe(early=True) == ["1", "0", "blocking_sync"]


@pytest.mark.gpu
def test_a_context_made_first_is_left_as_it_was():
    assert probe(early=False) == ["-", "0", "auto"]


def test_without_a_cuda_driver_nothing_is_set(monkeypatch):
    monkeypatch.setattr(gpuwait, "_driver", lambda: None)
    assert gpuwait.block_while_waiting() == 0
    assert gpuwait.wait_mode() == "unknown"


def test_a_gate_context_opens_one_work_queue_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(gpuwait, "_driver", lambda: None)
    monkeypatch.delenv(gpuwait.WORK_QUEUES, raising=False)
    assert gpuwait.work_queues() == "8 (driver default)"
    gpuwait.prepare_context()
    assert os.environ[gpuwait.WORK_QUEUES] == "1" and gpuwait.work_queues() == "1"
    monkeypatch.setenv(gpuwait.WORK_QUEUES, "4")
    gpuwait.prepare_context()
    assert gpuwait.work_queues() == "4"


def test_a_gate_that_needs_queues_at_once_gets_at_least_that_many(monkeypatch):
    """The runtime gate's worker and scheduler kernels run on two streams at once: with one
    hardware queue they serialise and the first launch hangs (seen on an H200), so its
    runner asks for the driver's default, whatever the user's smaller value."""
    import runpy
    from mpkbuild.runners import common
    monkeypatch.setattr(gpuwait, "_driver", lambda: None)
    asked = {}
    monkeypatch.setattr(common, "run_main", lambda body, **kw: asked.update(kw))
    runpy.run_module("mpkbuild.runners.runtime", run_name="__main__")
    assert asked["min_work_queues"] >= 2 and asked["block_while_waiting"] is False
    for users, expect in (("1", str(asked["min_work_queues"])), (None, str(asked["min_work_queues"])),
                          ("16", "16")):
        if users is None:
            monkeypatch.delenv(gpuwait.WORK_QUEUES, raising=False)
        else:
            monkeypatch.setenv(gpuwait.WORK_QUEUES, users)
        gpuwait.prepare_context(asked["min_work_queues"], block=False)
        assert os.environ[gpuwait.WORK_QUEUES] == expect, users
