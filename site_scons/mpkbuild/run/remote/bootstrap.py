"""The far end of the ssh backend: run one bundled gate on this machine, answer with JSON.

Nothing of ours is installed on the GPU machine. ssh runs `python3 -c BOOTSTRAP WORKDIR`:
the bootstrap (standard library only) reads `MPK-BUNDLE <n>\\n` and n bytes of bundle from
stdin, unpacks it into a fresh folder under WORKDIR, puts the bundle's own mpkbuild first
on sys.path and calls `main(folder)`, which runs the gate (bundle.run_unpacked) and prints
the envelope as the last stdout line, prefixed with `MPK-ENVELOPE `. The folder is removed
however it ends.

The build keeps stdin open while the gate runs. EOF on stdin means the ssh client is gone
(the build was interrupted, its watchdog fired, or it was killed): the runner's process
group is killed at once, so nothing keeps running on the remote GPU. The runner's own
lifeline (runners/lifeline.py) covers this process dying.
With mpkbuild installed on the far side, `python -m mpkbuild.run.remote.bootstrap [WORKDIR]` does the same.
"""
from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

MAGIC = b"MPK-BUNDLE"
ENVELOPE_PREFIX = "MPK-ENVELOPE "

# Run as `python3 -c BOOTSTRAP WORKDIR` (an empty WORKDIR: <tmp>/mpk-gates-<uid>).
BOOTSTRAP = r'''
import io, os, shutil, sys, tarfile, tempfile
i = sys.stdin.buffer
h = i.readline().split()
if len(h) != 2 or h[0] != b"MPK-BUNDLE":
    sys.exit("mpk remote: no bundle header on stdin")
n = int(h[1])
data = i.read(n)
if len(data) != n:
    sys.exit("mpk remote: the bundle was cut short (%d of %d bytes)" % (len(data), n))
if sys.version_info < (3, 10):
    sys.exit("mpk remote: %s is Python %d.%d; the runners need 3.10 or newer"
             % (sys.executable, sys.version_info[0], sys.version_info[1]))
base = sys.argv[1] or os.path.join(tempfile.gettempdir(), "mpk-gates-%d" % os.getuid())
os.makedirs(base, exist_ok=True)
d = tempfile.mkdtemp(prefix="mpk-", dir=base)
code = 1
try:
    t = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
    for m in t.getmembers():
        if m.name.startswith("/") or ".." in m.name.split("/") or not (m.isfile() or m.isdir()):
            sys.exit("mpk remote: bundle member %r is not a plain file inside the bundle" % m.name)
    t.extractall(os.path.join(d, "bundle"))
    del data
    sys.path.insert(0, os.path.join(d, "bundle", "_mpk"))
    from mpkbuild.run.remote import bootstrap as remote
    code = remote.main(d)
finally:
    shutil.rmtree(d, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
# no interpreter shutdown: a daemon thread still reads the open stdin, and finalising
# the stdin buffer under it aborts the process (SIGABRT) after the envelope was sent
os._exit(code)
'''


def _watch_stdin(closed: threading.Event, stream) -> None:
    """Set `closed` when stdin reaches EOF (or fails): the build side is gone."""
    try:
        while stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
            pass
    except (OSError, ValueError):
        pass
    closed.set()


def emit(envelope: dict) -> None:
    try:
        sys.stdout.write("\n" + ENVELOPE_PREFIX + json.dumps(envelope) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass                                        # nobody is listening any more


def main(folder, stdin=None) -> int:
    """Run the unpacked bundle in `folder`; print the envelope; 0, or 3 when interrupted."""
    from mpkbuild.run.remote import bundle
    from mpkbuild.run.job import GateInterrupted
    closed = threading.Event()
    threading.Thread(target=_watch_stdin, args=(closed, stdin or sys.stdin.buffer),
                     name="mpk-stdin-eof", daemon=True).start()
    try:
        envelope = bundle.run_unpacked(Path(folder), should_stop=closed.is_set)
    except GateInterrupted as exc:
        sys.stderr.write(f"mpk remote: {exc} (the build side went away)\n")
        return 3
    except bundle.BundleError as exc:
        envelope = {"error": str(exc)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    emit(envelope)
    return 0


def read_bundle(stream) -> bytes:
    """The length-prefixed bundle at the start of `stream`."""
    head = stream.readline().split()
    if len(head) != 2 or head[0] != MAGIC or not head[1].isdigit():
        raise SystemExit("mpk remote: no bundle header on stdin")
    data = stream.read(int(head[1]))
    if len(data) != int(head[1]):
        raise SystemExit(f"mpk remote: the bundle was cut short ({len(data)} of {int(head[1])} bytes)")
    return data


def frame(data: bytes) -> bytes:
    """What the build side writes to the remote's stdin (then keeps it open)."""
    return MAGIC + b" %d\n" % len(data) + data


def parse_envelope(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(ENVELOPE_PREFIX):
            try:
                return json.loads(line[len(ENVELOPE_PREFIX):])
            except ValueError:
                return None
    return None


if __name__ == "__main__":
    from mpkbuild.run.remote import bundle as _bundle
    import os
    _folder = _bundle.unpack(read_bundle(sys.stdin.buffer), sys.argv[1] if len(sys.argv) > 1 else None)
    _code = main(_folder)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)        # as BOOTSTRAP: no shutdown under the stdin-watching thread
