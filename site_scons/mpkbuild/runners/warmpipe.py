"""A gate's side of the two pipes the warm server (mpkbuild.warm) gives each child; in a
cold runner (no server) both calls do nothing. Standard library only.

- `done(code)`: the result file is written. The server answers the build at once, and the
  process's exit, whose CUDA context teardown takes ~0.1 s on an H200 (0.1-0.3 s when
  processes on two GPUs exit together), goes on while the build does.
- `wait_quiet()`: a timing runner calls it before its first timed replay. It returns when
  the server says that no other process of it is making a CUDA context or tearing one down
  on this GPU (a spare, or the gate before, still exiting), so the figures are taken on a
  quiet GPU while the runner's untimed start (inputs, capture) overlapped that work.
"""
from __future__ import annotations

import json
import os
import select
import time

STATUS_FD = "MPK_WARM_STATUS_FD"      # child -> server: "ready", "done CODE"
CONTROL_FD = "MPK_WARM_CONTROL_FD"    # server -> child: the request, "make_context", "quiet"
QUIET = b"quiet\n"
QUIET_TIMEOUT_S = 30.0
# Tests stand in for a CUDA context's start and teardown with sleeps: {"context": s, "exit": s}
TEST_DELAYS = "MPK_WARM_TEST_DELAYS"

_said_done = False
_quiet = False


def _fd(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def test_delay(what: str) -> float:
    try:
        return float(json.loads(os.environ.get(TEST_DELAYS) or "{}").get(what, 0.0))
    except (ValueError, AttributeError):
        return 0.0


def say(line: str) -> None:
    fd = _fd(STATUS_FD)
    if fd is not None:
        try:
            os.write(fd, f"{line}\n".encode())
        except OSError:
            pass


def done(code: int) -> None:
    """Once per process, just before it exits."""
    global _said_done
    if _said_done or _fd(STATUS_FD) is None:
        return
    _said_done = True
    say(f"done {int(code)}")
    delay = test_delay("exit")
    if delay:
        time.sleep(delay)


def wait_quiet(timeout_s: float = QUIET_TIMEOUT_S) -> float:
    """Seconds waited (0 after the first call). Past the timeout it returns anyway: a server
    that never answers must not hang the gate, and a cold runner times the same way."""
    global _quiet
    fd = _fd(CONTROL_FD)
    if _quiet or fd is None:
        return 0.0
    _quiet = True
    start = time.monotonic()
    seen = b""
    while QUIET not in seen:
        left = timeout_s - (time.monotonic() - start)
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        seen += chunk
    return time.monotonic() - start
