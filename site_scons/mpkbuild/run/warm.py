"""Warm runners: one server per GPU imports torch once and forks a fresh child per gate.

Importing torch costs seconds (4.7 s on the H200 box) and every validate gate used to pay
it. The server imports torch and the runner modules but never touches CUDA; each gate is a
child forked from it that starts its own session, initialises CUDA itself and dies at the
end, so a kernel that crashes or corrupts its context takes down only that child. The
executor supervises the child exactly as it does a cold runner (watchdog, group kill):
the server reports the child's exit status once it has reaped it.

A server is keyed by GPU and by the code it imported (mpkbuild's sources, the runner
package, the Python): an edit to the runners starts a new server, and the old one exits
after being idle (MPK_WARM_IDLE_S, default 900 s). When the client that asked for a gate
goes away (killed build), the server kills that gate's child.
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

from mpkbuild.run import job as ex
from mpkbuild.run.leases import lease_dir

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


def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return s
    except OSError:
        s.close()
        return None


def _ensure_server(path: Path, package: str, env: dict, preload: tuple[str, ...] = ()) -> socket.socket:
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
        proc = subprocess.Popen([sys.executable, "-m", "mpkbuild.run.warm", str(path), package, *preload],
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
    try:
        conn = _ensure_server(socket_path(gpu_uuid, package), package, env, job.preload)
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
    # the watchdog times the gate from its fork on: a server's start (its imports, bounded by
    # START_TIMEOUT_S) is no part of the job's timeout, which on a loaded machine it could
    # eat whole before the runner printed a line (tests/run/test_warm.py's hanging gate)
    return ex.supervise(_WarmChild(conn, pid), job, should_stop, time.monotonic())


# ---------------------------------------------------------------- the server
def _child(request: dict, package: str) -> None:
    """In the forked child: own session, own log, then the runner as __main__."""
    code = 1
    try:
        os.setsid()
        fd = os.open(request["log_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.update(request.get("env") or {})
        from mpkbuild.runners import lifeline
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
        finally:
            os._exit(code)


def serve(path: Path, package: str, idle_s: float, preload: tuple[str, ...] = ()) -> None:
    """One GPU's server: accept a request, fork its child, answer its client with the
    child's exit status when the child is reaped; exit after `idle_s` without a gate.
    `preload`: the runner modules (of `package`) imported once, here, before any fork."""
    import torch  # noqa: F401  (the point: import once; CUDA stays uninitialised)
    for name in preload:
        try:
            importlib.import_module(f"{package}.{name}")
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
    clients: dict[int, socket.socket | None] = {}   # running child's pid -> its client (None: gone)
    last_busy = time.monotonic()
    print(f"warm server {os.getpid()} on {path} (CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES')})", flush=True)
    try:
        while clients or time.monotonic() - last_busy < idle_s:
            conns = [c for c in clients.values() if c is not None]
            ready, _, _ = select.select([listener, wake_r, *conns], [], [], 1.0)
            for s in ready:
                if s == wake_r:
                    os.read(wake_r, 512)
                elif s is listener:
                    conn, _ = listener.accept()
                    conn.settimeout(10.0)
                    last_busy = time.monotonic()
                    try:
                        request = json.loads(conn.makefile("rb").readline())
                    except (OSError, ValueError):
                        conn.close()
                        continue
                    pid = os.fork()
                    if pid == 0:
                        try:
                            listener.close()
                            for fd in (wake_r, wake_w):
                                os.close(fd)
                            for c in (*conns, conn):
                                c.close()
                            _child(request, package)
                        finally:
                            os._exit(1)
                    clients[pid] = conn
                    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
                elif not s.recv(1, socket.MSG_PEEK):        # the client went away
                    pid = next(p for p, c in clients.items() if c is s)
                    clients[pid] = None
                    s.close()
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = clients.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall((json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n").encode())
                    except OSError:
                        pass
                    conn.close()
                last_busy = time.monotonic()
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2], float(os.environ.get("MPK_WARM_IDLE_S", "900")),
          tuple(sys.argv[3:]))
