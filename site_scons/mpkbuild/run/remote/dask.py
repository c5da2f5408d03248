"""GPU gates on a dask.distributed cluster: `executor=dask scheduler=tcp://HOST:8786`.

Each gate becomes one dask task needing the worker resource `GPU=1` (workers run one per GPU:
`CUDA_VISIBLE_DEVICES=i dask worker ... --resources GPU=1`, dask-cuda, dask-jobqueue). The
task carries the gate's bundle (bundle.py: the job, exactly its input files and mpkbuild's
source) and a small function shipped *by value*, so a worker needs Python, torch and dask
and nothing of ours. On the worker that function starts the same stdlib bootstrap the ssh
backend uses (run/remote/bootstrap.py) as a subprocess, feeds it the bundle on stdin and keeps stdin open:
the bootstrap leases a GPU of that machine and runs the runner under the shared watchdog,
so a CUDA fault kills a runner, never the worker. Closing stdin (the future was cancelled,
the build was interrupted or died, the worker itself died) kills the runner at once.

This side waits for the future polling `should_stop` (an interrupt cancels the future) and
keeps a watchdog of its own from the moment the worker reports the gate started (a worker
that hangs or vanishes mid-gate cannot hang the build; the far side's own watchdog is what
gives `hang` for a hung runner). Nothing here imports dask unless executor=dask is chosen.
"""
from __future__ import annotations

import atexit
import builtins
import dataclasses
import json
import socket
import sys
import threading
import time
import types
import uuid
from pathlib import Path

from mpkbuild import gpu as gpu_mod
from mpkbuild.run.job import PACKAGE_PARENT, ExecutorError, GateInterrupted, GateJob

TOPIC = "mpk-gate"               # worker -> build events (the gate started on a worker)
CONNECT_TIMEOUT_S = 10.0         # scheduler_timeout=: a dead address fails within this
CALL_TIMEOUT_S = 60.0            # one question to the workers (the GPU fingerprint)
WATCHDOG_MARGIN_S = 60.0         # beyond the gate's watchdog: unpacking, python start, reply
STOP_GRACE_S = 15.0              # a cancelled gate's bootstrap gets this long to clean up
POLL_S = 0.1
HEALTH_EVERY_S = 10.0            # while queued: is any GPU worker left to run the gate?

START_WORKERS_HELP = (
    "start one worker per GPU on each GPU box, e.g. `CUDA_VISIBLE_DEVICES=0 dask worker {addr} "
    "--nthreads 1 --resources GPU=1` (or `dask cuda worker {addr} --resources GPU=1`); "
    "see docs/executors.md")


# ---------------------------------------------------------------- what runs on a worker
# These functions travel by value (see _by_value): standard library and distributed only,
# every import inside the body, no module globals, so the worker needs nothing of ours.

def _worker_fingerprint(gpu_source):
    """On a worker: gpu.py's detect() (its source is shipped), plus where it ran."""
    import os
    import socket
    import sys
    import types
    name = "_mpk_dask_gpu_probe"
    module = types.ModuleType(name)
    sys.modules[name] = module               # dataclasses looks its module up while building
    try:
        exec(compile(gpu_source, "mpkbuild/gpu.py", "exec"), module.__dict__)
        fp = module.detect()
        answer = {"fingerprint": fp.to_json() if fp else None,
                  "absence": None if fp else module.describe_absence()}
    finally:
        sys.modules.pop(name, None)
    answer.update(host=socket.gethostname(), python=sys.executable,
                  visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    return answer


def _worker_gate(framed, bootstrap, prefix, topic, grace_s):
    """On a worker: run one bundled gate through the bootstrap; stop it if the task is cancelled."""
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import tempfile
    import time
    from distributed import get_worker
    from distributed.worker import thread_state

    worker = get_worker()
    key = getattr(thread_state, "key", None)
    started = time.time()
    worker.log_event(topic, {"key": key, "state": "started", "worker": worker.address,
                             "host": socket.gethostname(), "time": started})
    base = os.path.join(worker.local_directory, "mpk-gates")
    os.makedirs(base, exist_ok=True)

    def still_wanted():
        ts = worker.state.tasks.get(key) if key is not None else None
        return key is None or (ts is not None and ts.state in ("executing", "long-running"))

    with tempfile.TemporaryFile(dir=base) as out, tempfile.TemporaryFile(dir=base) as err:
        proc = subprocess.Popen([sys.executable, "-c", bootstrap, base], stdin=subprocess.PIPE,
                                stdout=out, stderr=err, start_new_session=True)
        try:
            proc.stdin.write(framed)
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        del framed
        cancelled, kill_at = False, None
        while proc.poll() is None:
            if not cancelled and not still_wanted():
                cancelled, kill_at = True, time.monotonic() + grace_s
                try:
                    proc.stdin.close()               # EOF: the bootstrap kills its runner
                except OSError:
                    pass
            if kill_at is not None and time.monotonic() > kill_at:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        try:
            proc.stdin.close()
        except OSError:
            pass
        out.seek(0)
        stdout = out.read().decode(errors="replace")
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    envelope = None
    for line in reversed(stdout.splitlines()):
        if line.startswith(prefix):
            try:
                envelope = json.loads(line[len(prefix):])
            except ValueError:
                pass
            break
    return {"envelope": envelope, "returncode": proc.returncode, "cancelled": cancelled,
            "stderr": "\n".join(stderr.splitlines()[-30:]), "worker": worker.address,
            "host": socket.gethostname(), "started": started, "finished": time.time()}


def _by_value(fn):
    """A copy of `fn` that pickles by value: its module is one no process can import, so
    dask's pickle falls back to cloudpickle, which then ships the code itself."""
    copy = types.FunctionType(fn.__code__, {"__builtins__": builtins, "__name__": "_mpk_dask_remote"},
                              fn.__name__, fn.__defaults__)
    copy.__module__ = "_mpk_dask_remote"
    copy.__qualname__ = fn.__name__
    return copy


# ---------------------------------------------------------------- the build side
class DaskExecutor:
    """Gates as dask tasks needing `GPU=1`, one per GPU worker at a time."""

    name = "dask"

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})
        self.address = self.options.get("scheduler") or None
        self.scheduler_file = self.options.get("scheduler_file") or None
        if not self.address and not self.scheduler_file:
            raise ExecutorError("executor=dask needs scheduler=tcp://HOST:8786 (the address "
                                "`dask scheduler` prints) or scheduler_file=PATH")
        try:
            self.connect_timeout_s = float(self.options.get("scheduler_timeout", CONNECT_TIMEOUT_S))
        except ValueError:
            raise ExecutorError(f"scheduler_timeout={self.options['scheduler_timeout']}: "
                                "expected seconds, e.g. scheduler_timeout=10") from None
        self._client = None
        self._lock = threading.Lock()
        self._fp: gpu_mod.GpuFingerprint | None = None
        self._workers: list[str] | None = None      # None: any GPU worker; else only these
        self._absence = "no dask worker with GPU resources answered"
        self._started: dict[str, tuple[float, dict]] = {}   # task key -> (monotonic, event)

    # ---------------------------------------------------------- connection
    def _scheduler_address(self) -> str:
        if self.address:
            return self.address
        path = Path(self.scheduler_file)
        try:
            info = json.loads(path.read_text())
            return info["address"]
        except OSError as exc:
            raise ExecutorError(f"scheduler_file={path}: {exc.strerror}; the file `dask scheduler "
                                f"--scheduler-file {path}` writes (start the scheduler first)") from None
        except (ValueError, KeyError, TypeError):
            raise ExecutorError(f"scheduler_file={path}: not a dask scheduler file "
                                "(JSON with an \"address\")") from None

    def client(self):
        """The distributed Client, connected on first use within scheduler_timeout= seconds."""
        with self._lock:
            if self._client is not None:
                return self._client
            try:
                import distributed
            except ImportError as exc:
                raise ExecutorError(
                    f"executor=dask needs dask.distributed in the Python that runs scons "
                    f"({sys.executable}): pip install -e '.[dask]' ({exc})") from None
            address = self._scheduler_address()
            self._probe(address)
            try:
                client = distributed.Client(address, timeout=self.connect_timeout_s,
                                            set_as_default=False, name="mpkbuild")
            except (OSError, TimeoutError, ValueError) as exc:
                raise ExecutorError(
                    f"scheduler={address}: no dask scheduler answered within "
                    f"{self.connect_timeout_s:g} s ({exc}). Start one with `dask scheduler` on "
                    f"that host (it prints its tcp:// address) or fix scheduler=; "
                    f"scheduler_timeout= sets the wait") from None
            client.subscribe_topic(TOPIC, self._on_event)
            self._client = client
            atexit.register(self.close)
            return client

    def _probe(self, address: str) -> None:
        """A plain TCP connect first: a port with nothing listening fails at once, where the
        dask client would retry until its timeout."""
        scheme, _, rest = address.rpartition("://")
        if scheme not in ("", "tcp") or ":" not in rest:
            return
        host, _, port = rest.rpartition(":")
        if not port.isdigit():
            raise ExecutorError(f"scheduler={address}: expected tcp://HOST:PORT "
                                "(the address `dask scheduler` prints)")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout_s).close()
        except ConnectionRefusedError:
            raise ExecutorError(f"scheduler={address}: nothing is listening there (connection "
                                f"refused). Start a scheduler with `dask scheduler --port {port}` on "
                                f"{host} (it prints its tcp:// address) or fix scheduler=") from None
        except OSError as exc:
            raise ExecutorError(f"scheduler={address}: cannot reach {host}:{port} within "
                                f"{self.connect_timeout_s:g} s ({exc.strerror or exc}); is the host "
                                "up and the port open? scheduler_timeout= sets the wait") from None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close(timeout=3)
            except Exception:               # closing at exit: nothing left to tell anyone
                pass

    def _on_event(self, event) -> None:
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(msg, dict) and msg.get("key"):
            self._started[msg["key"]] = (time.monotonic(), msg)

    def _call(self, what: str, fn, timeout_s: float = CALL_TIMEOUT_S):
        """fn() in a helper thread, bounded: a worker that does not answer cannot hang us."""
        box: dict = {}

        def target():
            try:
                box["value"] = fn()
            except BaseException as exc:       # handed to the caller below
                box["error"] = exc
        thread = threading.Thread(target=target, name=f"mpk-dask-{what}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise ExecutorError(f"scheduler={self.address or self.scheduler_file}: {what} got no "
                                f"answer within {timeout_s:g} s (a worker or the scheduler is stuck)")
        if "error" in box:
            raise ExecutorError(f"scheduler={self.address or self.scheduler_file}: {what} failed: "
                                f"{box['error']}") from box["error"]
        return box["value"]

    def gpu_workers(self) -> dict[str, float]:
        """{worker address: GPU resource} for every worker that declares GPU resources."""
        info = self._call("listing the workers", lambda: self.client().scheduler_info(), 30.0)
        return {addr: float((w.get("resources") or {}).get("GPU", 0))
                for addr, w in (info.get("workers") or {}).items()
                if float((w.get("resources") or {}).get("GPU", 0)) >= 1}

    # ---------------------------------------------------------- the executor interface
    def fingerprint(self) -> gpu_mod.GpuFingerprint | None:
        """The GPU of the cluster's GPU workers (they must agree on the model; the most common
        model wins and gates go only to its workers). No GPU worker: ExecutorError."""
        if self._fp is not None:
            return self._fp
        client = self.client()
        address = client.scheduler.address
        workers = self.gpu_workers()
        if not workers:
            others = len(self._call("listing the workers", lambda: client.scheduler_info(), 30.0)
                         .get("workers") or {})
            raise ExecutorError(
                f"scheduler={address} has no worker with GPU resources ({others} worker(s) "
                f"without): {START_WORKERS_HELP.format(addr=address)}")
        source = (PACKAGE_PARENT / "mpkbuild" / "gpu.py").read_text()
        answers = self._call("asking the GPU workers for their GPU", lambda: client.run(
            _by_value(_worker_fingerprint), source, workers=sorted(workers), on_error="return"))
        by_sig: dict[str, list[str]] = {}
        fps, problems = {}, []
        for addr in sorted(workers):
            answer = answers.get(addr)
            if isinstance(answer, BaseException) or not isinstance(answer, dict):
                problems.append(f"{addr}: {answer!r}")
            elif answer.get("fingerprint") is None:
                problems.append(f"{addr} ({answer.get('host')}): declares GPU resources but sees "
                                f"no GPU ({answer.get('absence')}; CUDA_VISIBLE_DEVICES="
                                f"{answer.get('visible')})")
            else:
                fps[addr] = gpu_mod.GpuFingerprint(**answer["fingerprint"])
                by_sig.setdefault(fps[addr].signature(), []).append(addr)
        if not fps:
            self._absence = "; ".join(problems)
            raise ExecutorError(f"scheduler={address}: no GPU worker has a usable GPU: "
                                f"{self._absence}")
        chosen = max(by_sig.values(), key=len)
        first = fps[chosen[0]]
        if len(chosen) < len(workers):
            left = [f"{a} ({fps[a].signature() if a in fps else 'no GPU'})" for a in sorted(workers)
                    if a not in chosen]
            sys.stderr.write(f"mpk: dask: gates are judged for {first.signature()} and go only to "
                             f"its {len(chosen)} worker(s); left out: {', '.join(left)}\n")
            self._workers = chosen
        self._fp = dataclasses.replace(first, count=int(sum(workers[a] for a in chosen)))
        return self._fp

    def absence(self) -> str:
        return self._absence

    def run(self, job: GateJob, should_stop=lambda: False) -> dict:
        from mpkbuild.run.remote import bundle, bootstrap as remote
        fp = self.fingerprint()
        # no gpus=: each worker owns its GPU(s) through its own CUDA_VISIBLE_DEVICES
        data = bundle.pack_for(job, f"{job.gate} {job.kernel}", model=fp.name if fp else None)
        client = self.client()
        key = f"mpk-{job.gate}-{job.kernel}-{uuid.uuid4().hex[:8]}"
        restrict = {"workers": self._workers} if self._workers else {}
        submitted = time.monotonic()
        future = client.submit(_by_value(_worker_gate), remote.frame(data), remote.BOOTSTRAP,
                               remote.ENVELOPE_PREFIX, TOPIC, STOP_GRACE_S, key=key, pure=False,
                               resources={"GPU": 1}, retries=0, **restrict)
        del data
        try:
            early = self._wait(future, job, key, should_stop)
        except BaseException:
            future.cancel()
            raise
        finally:
            started = self._started.pop(key, None)
        if early is not None:
            return early
        reply = future.result()
        envelope = reply.get("envelope")
        where = f"dask worker {reply.get('worker')} ({reply.get('host')})"
        if envelope is None:
            raise ExecutorError(f"{job.gate} {job.kernel}: {where} gave no answer (bootstrap exit "
                                f"{reply.get('returncode')}): {reply.get('stderr') or 'no output'}")
        if "error" in envelope:
            raise ExecutorError(f"{job.gate} {job.kernel}: {where}: {envelope['error']}")
        result = bundle.apply_envelope(job, envelope)
        result["worker"] = reply.get("worker")
        result["started_at"] = round(reply["started"], 3)
        result["finished_at"] = round(reply["finished"], 3)
        if started is not None:
            result["queue_wait_s"] = round(started[0] - submitted, 3)
        return result

    def _wait(self, future, job: GateJob, key: str, should_stop) -> dict | None:
        """Until the future is done: None, or a result when the local watchdog gave up.
        Raises GateInterrupted (should_stop) or ExecutorError (cluster trouble)."""
        limit = job.watchdog_s + WATCHDOG_MARGIN_S
        next_health = time.monotonic() + HEALTH_EVERY_S
        while not future.done():
            if should_stop():
                raise GateInterrupted("the build was interrupted; the dask task was cancelled")
            now = time.monotonic()
            started = self._started.get(key)
            if started is not None and now - started[0] > limit:
                future.cancel()
                worker = started[1].get("worker")
                return {"verdict": "hang", "worker": worker,
                        "elapsed_s": round(now - started[0], 3),
                        "message": f"{job.gate} {job.kernel}: dask worker {worker} "
                                   f"({started[1].get('host')}) gave no answer {limit:g} s after the "
                                   f"gate started (its {job.watchdog_s:g} s watchdog + "
                                   f"{WATCHDOG_MARGIN_S:g} s): the worker hung or was lost; the "
                                   "task was cancelled"}
            if started is None and now >= next_health:
                next_health = now + HEALTH_EVERY_S
                self._check_cluster(job)
            time.sleep(POLL_S)
        if future.status == "cancelled":
            if should_stop():
                raise GateInterrupted("the build was interrupted; the dask task was cancelled")
            raise ExecutorError(f"{job.gate} {job.kernel}: the dask scheduler dropped the task "
                                f"{key} (scheduler restarted, or the client lost its connection)")
        if future.status == "error":
            exc = future.exception()
            if type(exc).__name__ == "KilledWorker":
                return {"verdict": "crash", "message": f"{job.gate} {job.kernel}: the dask workers "
                        f"running it died, again and again ({exc}); the runner may exhaust the "
                        "host's memory: run it with executor=local on a GPU box to see"}
            raise ExecutorError(f"{job.gate} {job.kernel}: the dask task {key} failed on the "
                                f"worker: {type(exc).__name__}: {exc}")
        return None

    def _check_cluster(self, job: GateJob) -> None:
        client = self.client()
        if client.status not in ("running", "connecting", "newly-created"):
            raise ExecutorError(f"{job.gate} {job.kernel}: lost the dask scheduler "
                                f"(client {client.status})")
        workers = self.gpu_workers()
        if self._workers:
            workers = {a: n for a, n in workers.items() if a in self._workers}
        if not workers:
            address = client.scheduler.address
            raise ExecutorError(f"{job.gate} {job.kernel}: the dask cluster at {address} has no "
                                f"GPU worker left to run it: {START_WORKERS_HELP.format(addr=address)}")
