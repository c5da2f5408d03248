"""Warm runners: one server per GPU imports torch once and forks a fresh child per gate.

Importing torch costs seconds (4.7 s on the H200 box) and every validate gate used to pay
it. The server imports torch and the runner modules but never touches CUDA; each gate is a
child forked from it that starts its own session, initialises CUDA itself and dies at the
end, so a kernel that crashes or corrupts its context takes down only that child. The
executor supervises the child exactly as it does a cold runner (watchdog, group kill).
Spares start CUDA ahead of their gate; a gate is answered as soon as its runner says its
result is written, and a timing gate times only once no other child of the server is making
or tearing down a context (`serve`, runners/warmpipe.py).

A server is keyed by GPU and by the code it imported (mpkbuild's sources, the runner
package, the Python): an edit to the runners starts a new server, and the old one exits
after being idle (MPK_WARM_IDLE_S, default 900 s); meanwhile only the server that ran the
latest gate on a GPU keeps spares there (`gpu_claim_path`). When the client that asked for
a gate goes away (killed build), the server kills that gate's child.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from . import executor as ex
from .fsutil import write_atomic
from .leases import lease_dir

GATES = ("validate", "perf", "bandwidth")
SPARE = os.environ.get("MPK_WARM_SPARE", "1") != "0"       # a CUDA-ready child kept waiting
# Gates a spare may make its CUDA context beside. Beside a timing gate (perf, bandwidth) it
# only loads the driver (cuInit: no context, no work on the GPU; 0.05-0.22 s of the
# 0.2-0.35 s a gate's CUDA start costs on the H200 hosts measured) and makes its context
# once the GPU is free. Processes looping on cuInit during graph-timed replays left the
# medians where the quiet phases around them put them; looping on contexts moved a ~1 us
# kernel's median by 3.6% in one of two runs (bench/spare_beside_timing.py, RESULTS.md).
CONTEXT_BESIDE = frozenset({"validate"})
# Spares kept per server, each with its context made while no timing gate ran: a gate after
# a perf then finds one ready instead of waiting ~0.3 s for a context (each holds ~0.5 GB of
# the GPU's memory while it waits).
SPARES = max(1, int(os.environ.get("MPK_WARM_SPARES", "2")))
# After a timing gate, no new context for this long: the next gate usually asks within it,
# and one being made would delay that gate's timing (it waits for "quiet").
AFTER_TIMING_S = 0.15
# A child that said "done" but is still exiting this long no longer holds back "quiet".
EXIT_WAIT_S = 10.0
START_TIMEOUT_S = 120.0


class WarmUnavailable(Exception):
    """The server could not be started or reached: the gate runs cold instead."""


@functools.lru_cache(maxsize=None)
def _code_hash(package: str) -> str:
    h = hashlib.sha256(f"{sys.executable}\n{package}\n".encode())
    roots = [ex.PACKAGE_PARENT / "mpkbuild"]
    spec = importlib.util.find_spec(package.split(".")[0])
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    for root in dict.fromkeys(roots):
        for path in sorted(root.rglob("*.py")):
            h.update(str(path).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def socket_path(gpu_uuid: str, package: str) -> Path:
    short = gpu_uuid.replace("GPU-", "")[:13]
    return lease_dir() / "warm" / f"{os.getuid()}-{short}-{_code_hash(package)}.sock"


def gpu_claim_path(server_socket: Path) -> Path:
    """Names the server (of this user, on this GPU) that ran the latest gate there: only
    that one keeps spare contexts. Idle contexts are not free: 60 of them, left by servers
    of finished test projects, made every gate on an H200 ~45% slower (RESULTS.md)."""
    return server_socket.with_name(server_socket.name.rsplit("-", 1)[0] + ".claim")


def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return s
    except OSError:
        s.close()
        return None


def _ensure_server(path: Path, package: str, env: dict) -> socket.socket:
    conn = _connect(path)
    if conn is not None:
        return conn
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".start"), "a") as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)      # one starter per server; others wait
        conn = _connect(path)
        if conn is not None:
            return conn
        path.unlink(missing_ok=True)
        server_env = ex.runner_env(env)
        server_env.pop("MPK_LIFELINE_PID", None)    # the server outlives this build
        log = open(path.with_suffix(".log"), "ab")
        proc = subprocess.Popen([sys.executable, "-m", "mpkbuild.warm", str(path), package],
                                env=server_env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _connect(path)
            if conn is not None:
                return conn
            if proc.poll() is not None:
                raise WarmUnavailable(f"the server exited with status {proc.returncode}; "
                                      f"see {path.with_suffix('.log')}")
            time.sleep(0.05)
        proc.kill()
        raise WarmUnavailable(f"the server did not answer within {START_TIMEOUT_S:g} s")


class _WarmChild:
    """The forked child, seen from the client: its pid, its exit status over the socket."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self._buf = conn, pid, b""

    def wait(self, timeout: float) -> int:
        self.conn.settimeout(max(timeout, 0.001))
        while b"\n" not in self._buf:
            try:
                chunk = self.conn.recv(4096)
            except socket.timeout:
                raise subprocess.TimeoutExpired("warm child", timeout) from None
            if not chunk:
                return -signal.SIGKILL          # the server died: treat as a killed child
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        self.conn.close()
        return int(json.loads(line)["exit"])

    def kill(self) -> None:
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue
        try:
            self.wait(5.0)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            pass
        self.conn.close()


def run(job: ex.GateJob, gpu_uuid: str, env: dict, should_stop) -> dict:
    package = ex.runner_package(job)
    job_file = ex.write_job(job)
    started = time.monotonic()
    try:
        conn = _ensure_server(socket_path(gpu_uuid, package), package, env)
        request = {"gate": job.gate, "job_file": str(job_file), "log_file": str(job.log_file),
                   "client_pid": os.getpid(), "env": env}
        conn.sendall((json.dumps(request) + "\n").encode())
        conn.settimeout(30.0)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                raise WarmUnavailable("the server closed the connection before forking")
            reply += chunk
    except OSError as exc:
        raise WarmUnavailable(str(exc)) from None
    pid = json.loads(reply)["pid"]
    return ex.supervise(_WarmChild(conn, pid), job, should_stop, started)


# ---------------------------------------------------------------- the server
def _read_line(fd: int) -> bytes:
    """One line, a byte at a time: what follows it (the server's "quiet") stays in the
    pipe for the runner to read."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line


def _spare(control_fd: int, package: str, context: bool) -> None:
    """A child forked ahead of its gate: it starts CUDA before the gate's clock does (0.3-0.4 s
    on an H200, more when two GPUs start theirs at once), then waits for one gate. With
    `context` (no timing gate running) it makes its context and says "ready"; beside a timing
    gate it only loads the driver, and makes the context when the server says so. The child
    is still fresh, used once, and alone in its session."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _start_cuda(context)
    while True:
        line = _read_line(control_fd)
        if not line:
            os._exit(0)
        request = json.loads(line)
        if request.get("make_context"):
            _start_cuda(True)
            continue
        _child(request, package, new_session=False)


def _start_cuda(context: bool) -> None:
    from .runners import gpuwait, warmpipe
    os.environ["MPK_WARM_SPARE"] = "context" if context else "driver"
    try:
        gpuwait.prepare_context()           # loads the driver (cuInit), before any context
        if context:
            import torch
            torch.cuda.init()
            torch.empty(1, device="cuda")
    except Exception:         # no usable GPU: the runner meets it again and reports it
        pass
    if context:
        time.sleep(warmpipe.test_delay("context"))
        os.environ["MPK_WARM_CONTEXT_AT"] = f"{time.time():.3f}"   # in the gate's log, for tests
        warmpipe.say("ready")


def _child(request: dict, package: str, new_session: bool = True) -> None:
    """In the forked child: own session, own log, then the runner as __main__."""
    code = 1
    try:
        if new_session:
            os.setsid()
        fd = os.open(request["log_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.update(request.get("env") or {})
        from .runners import lifeline
        lifeline.start(int(request["client_pid"]))
        sys.argv = [f"{package}.{request['gate']}", request["job_file"]]
        import runpy
        runpy.run_module(f"{package}.{request['gate']}", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            from .runners import warmpipe
            warmpipe.done(code)
        finally:
            os._exit(code)


class _Proc:
    """A forked child as the server sees it: a spare, then a running gate, then exiting.
    `control` and `status` are the server's ends of its two pipes (runners/warmpipe.py)."""

    def __init__(self, pid: int, control: int, status: int, context: bool):
        self.pid, self.control, self.status = pid, control, status
        self.context = context          # makes, or has made, its CUDA context
        self.ready = False              # ... and has made it
        self.gate: str | None = None
        self.conn: socket.socket | None = None
        self.exiting_since: float | None = None
        self.retired = False            # a spare told to exit unused
        self.pending = b""

    def tell(self, line: bytes) -> bool:
        try:
            os.write(self.control, line)
            return True
        except OSError:
            return False


def serve(path: Path, package: str, idle_s: float) -> None:
    """One GPU's server. Besides forking a child per gate it keeps SPARES children ready and
    keeps timing honest: a context is made (by a spare) only while no timing gate runs,
    and not in the AFTER_TIMING_S after one (its successor usually asks by then and takes
    a spare made earlier); a timing gate is told "quiet" once no context is being made or
    torn down by another child of this server. A gate's answer goes to the build when its
    runner says "done", before its exit; a child that dies without saying so is answered
    when it is reaped, with its exit status."""
    import torch  # noqa: F401  (the point: import once; CUDA stays uninitialised)
    from .runners.warmpipe import CONTROL_FD, QUIET, STATUS_FD
    for gate in GATES:
        try:
            importlib.import_module(f"{package}.{gate}")
        except ImportError:
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(16)
    # a child's exit wakes select at once (no polling delay added to every gate)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    procs: dict[int, _Proc] = {}          # every child not yet reaped, by pid
    spares: list[_Proc] = []
    by_status: dict[int, _Proc] = {}
    by_conn: dict[socket.socket, _Proc] = {}
    quiet_wanted: list[_Proc] = []
    claim = gpu_claim_path(path)
    last_busy = time.monotonic()
    timing_ended = float("-inf")
    spare_deaths = 0

    def running() -> list[_Proc]:
        return [p for p in procs.values() if p.gate is not None and p.exiting_since is None]

    def spawn(context: bool, request: dict | None = None) -> _Proc:
        control_r, control_w = os.pipe()
        status_r, status_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                listener.close()
                for fd in (wake_r, wake_w, control_w, status_r,
                           *(f for p in procs.values() for f in (p.control, p.status) if f >= 0)):
                    os.close(fd)
                for c in by_conn:
                    c.close()
                os.environ[CONTROL_FD], os.environ[STATUS_FD] = str(control_r), str(status_w)
                if request is None:
                    _spare(control_r, package, context)
                else:
                    _child(request, package)
            finally:
                os._exit(1)
        os.close(control_r)
        os.close(status_w)
        proc = _Proc(pid, control_w, status_r, context)
        procs[pid], by_status[status_r] = proc, proc
        return proc

    def answer(proc: _Proc, code: int) -> None:
        """The gate is over for the build: its exit code to its client."""
        nonlocal timing_ended, last_busy
        if proc.conn is not None:
            by_conn.pop(proc.conn, None)
            try:
                proc.conn.sendall((json.dumps({"exit": code}) + "\n").encode())
            except OSError:
                pass
            proc.conn.close()
            proc.conn = None
        if proc in quiet_wanted:
            quiet_wanted.remove(proc)
        if proc.gate is not None and proc.gate not in CONTEXT_BESIDE:
            timing_ended = time.monotonic()
        proc.exiting_since = time.monotonic()
        last_busy = time.monotonic()

    def forget(proc: _Proc) -> None:
        procs.pop(proc.pid, None)
        if proc in spares:
            spares.remove(proc)
        if proc in quiet_wanted:
            quiet_wanted.remove(proc)
        for attr in ("control", "status"):
            fd = getattr(proc, attr)
            if fd >= 0:
                by_status.pop(fd, None)
                os.close(fd)
                setattr(proc, attr, -1)

    def holds_gpu() -> bool:
        try:
            return claim.read_text() == path.name
        except OSError:
            return True                 # nobody claimed it yet

    def retire_spares() -> None:
        """Closing a spare's control pipe ends it; a timing gate that starts meanwhile
        waits for its context to go (exiting_since, as for a finished gate)."""
        for proc in spares:
            proc.retired, proc.exiting_since = True, time.monotonic()
            os.close(proc.control)
            proc.control = -1
        spares.clear()

    def take_spare() -> _Proc | None:
        for wanted in ((True, True), (True, False), (False, False)):
            for proc in spares:
                if (proc.context, proc.ready) == wanted:
                    spares.remove(proc)
                    return proc
        return None

    print(f"warm server {os.getpid()} on {path} (CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES')}, {SPARES} spare(s))", flush=True)
    try:
        while running() or time.monotonic() - last_busy < idle_s:
            now = time.monotonic()
            gates = running()
            settling = now - timing_ended < AFTER_TIMING_S
            beside_ok = all(p.gate in CONTEXT_BESIDE for p in gates)
            if not gates and not holds_gpu():
                retire_spares()         # another server's gates run here now
            elif SPARE:
                while len(spares) < SPARES and spare_deaths < 3:
                    # beside timing, or just after it: the driver only
                    spares.append(spawn(beside_ok and not settling))
                # just after a timing gate, one context at most, and only if none is ready
                # or being made: the next gate would otherwise make its own
                upgrades = [p for p in spares if not p.context] if beside_ok else []
                if settling and any(p.context for p in spares):
                    upgrades = []
                for proc in upgrades[:1] if settling else upgrades:
                    if proc.tell(b'{"make_context": true}\n'):
                        proc.context = True
            if quiet_wanted:
                busy = any(p.context and not p.ready for p in spares) or any(
                    p.exiting_since is not None and now - p.exiting_since < EXIT_WAIT_S
                    for p in procs.values())
                if not busy:
                    for proc in quiet_wanted:
                        proc.tell(QUIET)
                    quiet_wanted.clear()
            wait = 1.0
            if quiet_wanted:
                wait = 0.25          # an exit past EXIT_WAIT_S stops counting without an event
            if settling:
                wait = min(wait, max(0.0, AFTER_TIMING_S - (now - timing_ended)) + 0.001)
            ready, _, _ = select.select([listener, wake_r, *by_conn, *by_status], [], [], wait)
            for s in ready:
                if s == wake_r:
                    os.read(wake_r, 512)
                elif s is listener:
                    conn, _ = listener.accept()
                    conn.settimeout(10.0)
                    last_busy = time.monotonic()
                    try:
                        line = conn.makefile("rb").readline()
                        request = json.loads(line)
                    except (OSError, ValueError):
                        conn.close()
                        continue
                    write_atomic(claim, path.name)
                    proc = take_spare()
                    if proc is not None and not proc.tell(line if line.endswith(b"\n") else line + b"\n"):
                        proc = None               # it died meanwhile: fork afresh
                    if proc is None:
                        proc = spawn(False, request)
                    proc.gate, proc.conn = str(request.get("gate")), conn
                    by_conn[conn] = proc
                    if proc.gate not in CONTEXT_BESIDE:
                        quiet_wanted.append(proc)
                    conn.sendall((json.dumps({"pid": proc.pid}) + "\n").encode())
                elif isinstance(s, int):                    # a child's status pipe
                    proc = by_status.get(s)
                    if proc is None:
                        continue
                    chunk = os.read(s, 256)
                    if not chunk:
                        by_status.pop(s, None)
                        os.close(s)
                        proc.status = -1
                        continue
                    proc.pending += chunk
                    while b"\n" in proc.pending:
                        said, proc.pending = proc.pending.split(b"\n", 1)
                        if said == b"ready":
                            proc.ready = True
                        elif said.startswith(b"done ") and proc.gate is not None \
                                and proc.exiting_since is None:
                            answer(proc, int(said.split()[1]))
                elif not s.recv(1, socket.MSG_PEEK):        # the client went away
                    proc = by_conn.pop(s)
                    proc.conn = None
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    s.close()
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                proc = procs.get(pid)
                if proc is None:
                    continue
                if proc in spares:                          # died before any gate
                    spare_deaths += 1
                elif proc.gate is not None and proc.exiting_since is None:   # no "done"
                    answer(proc, os.waitstatus_to_exitcode(status))
                forget(proc)
                if not proc.retired:
                    last_busy = time.monotonic()
    finally:
        path.unlink(missing_ok=True)
        for proc in spares:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2], float(os.environ.get("MPK_WARM_IDLE_S", "900")))
