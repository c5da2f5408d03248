"""A runner outlives nothing: when the process that launched it dies, it kills its group.

The launcher's pid comes in $MPK_LIFELINE_PID (set by the executor). A daemon thread checks
twice a second that it is alive; a SIGKILLed scons cannot clean up after itself, so its
runner does it. No-op when the variable is unset (a runner started by hand).
"""
from __future__ import annotations

import os
import signal
import threading
import time

from ..util.fsutil import process_exists

_started = False


def _watch(pid: int, period_s: float) -> None:
    while process_exists(pid):
        time.sleep(period_s)
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(137)


def start(pid: int, period_s: float = 0.5) -> None:
    global _started
    if _started or pid <= 1:
        return
    _started = True
    threading.Thread(target=_watch, args=(pid, period_s), name="mpk-lifeline", daemon=True).start()


def start_from_env() -> None:
    value = os.environ.get("MPK_LIFELINE_PID", "")
    if value.isdigit():
        start(int(value))
