"""The ssh backend: GPU gates on a remote GPU box (`gpu_host=user@host`).

One ssh call per gate: the job bundle (bundle.py: the gate's inputs and mpkbuild's own
source) streams to a standard-library bootstrap run by the remote Python (run/remote/bootstrap.py),
which leases a GPU there, runs the gate with the shared watchdog, and answers with the
result and the log on its last stdout line. Nothing of ours needs to be installed there:
Python 3.10+ with torch, nvidia-smi and the CUDA driver are enough.

The fingerprint is the remote GPU's, read with one ssh call (nvidia-smi and the torch
version there). ssh always runs with BatchMode=yes and a short ConnectTimeout, so an
unreachable host, a refused key, an unknown host key or a missing remote Python fails in
seconds with an ExecutorError that says what to fix, never with a prompt.

Options (scons command line): gpu_host=, gpu_workdir= (remote folder; default
<remote tmp>/mpk-gates-<uid>), gpu_python= (default python3; shell words, e.g.
`/opt/conda/bin/python`), ssh_opts= (extra ssh options, e.g. `-p 2222 -i ~/.ssh/gpu`; also
$MPK_SSH_OPTS), ssh_connect_timeout= (seconds, default 8), gpus= (indices on the remote box).
The build keeps the remote's stdin open while a gate runs: when the build stops the gate
(interrupt) or dies, ssh goes away and the remote kills its runner on stdin EOF.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time

from mpkbuild.run.remote import bundle, bootstrap as remote
from mpkbuild.run.job import ExecutorError, GateJob, watch
from mpkbuild.gpu import GpuFingerprint, parse_smi

DEFAULT_CONNECT_TIMEOUT_S = 8
PROBE_TIMEOUT_S = 60          # connect + nvidia-smi + importlib.metadata on the remote
# Beyond the gate's own watchdog (the remote enforces it): connect, transfer, lease wait is
# not bounded here (the remote's should_stop covers interrupts), unpacking, reply.
MARGIN_S = 60.0
SSH_TRANSFER_BPS = 2e6        # a slow link: the local watchdog allows this much time to ship

# Runs on the remote with its Python (standard library only): the facts of its GPUs.
PROBE = r'''
import json, os, shutil, subprocess, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
       "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "csv": "", "smi": None}
try:
    import importlib.metadata as m
    out["torch"] = m.version("torch")
except Exception:
    out["torch"] = None
smi = shutil.which("nvidia-smi")
if smi is None:
    out["smi"] = "nvidia-smi not found on PATH"
else:
    try:
        p = subprocess.run([smi, "--query-gpu=index,uuid,name,compute_cap,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            out["smi"] = "nvidia-smi failed: " + (p.stdout + p.stderr).strip()[-300:]
        else:
            out["csv"] = p.stdout
    except Exception as e:
        out["smi"] = "nvidia-smi failed: %s" % e
print("MPK-PROBE " + json.dumps(out))
'''


def _ssh_error(host: str, stderr: str, opts_hint: str) -> str:
    """What ssh's own failure (exit 255) means, and what to do about it."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "no message"
    low = text.lower()
    if "permission denied" in low or "too many authentication failures" in low:
        return (f"gpu_host={host}: the host refused the key ({last}). Add your public key to "
                f"~/.ssh/authorized_keys on {host.split('@')[-1]}, or name the right identity file "
                f"with ssh_opts='-i ~/.ssh/KEY' (or $MPK_SSH_OPTS); ssh runs in BatchMode, so "
                "there is no password prompt")
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return (f"gpu_host={host}: the host key is not known or does not match ({last}). Connect "
                f"once by hand (`ssh {host}`) to check and accept it, or give a known-hosts file "
                "with ssh_opts='-o UserKnownHostsFile=FILE'")
    for clue in ("connection refused", "timed out", "could not resolve", "no route to host",
                 "network is unreachable", "name or service not known", "connection closed",
                 "connection reset", "temporary failure in name resolution", "bad port"):
        if clue in low:
            return (f"gpu_host={host}: cannot reach the host ({last}). Check the host name, that "
                    f"sshd runs there and the port (ssh_opts='-p PORT'){opts_hint}")
    return f"gpu_host={host}: ssh failed ({last}){opts_hint}"


class _SshChild:
    """The ssh client as run/job.watch's child: wait(timeout) and kill()."""

    def __init__(self, proc, kill):
        self.proc, self._kill = proc, kill

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        self._kill(self.proc)


class _Pipe(threading.Thread):
    """Collect one of the ssh client's output streams without blocking the watchdog."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.chunks = stream, []
        self.start()

    def run(self):
        for chunk in iter(lambda: self.stream.read1(65536), b""):
            self.chunks.append(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


class SshExecutor:
    """GPU gates on `gpu_host=`: one ssh call per gate, the bundle on its stdin."""

    name = "ssh"

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})
        self.host = (self.options.get("gpu_host") or "").strip()
        if not self.host:
            raise ExecutorError("executor=ssh needs gpu_host=USER@HOST (the GPU box to run gates on)")
        self.workdir = self.options.get("gpu_workdir") or ""
        self.python = self.options.get("gpu_python") or "python3"
        try:
            self.extra = shlex.split(os.environ.get("MPK_SSH_OPTS", "")) + \
                shlex.split(self.options.get("ssh_opts") or "")
        except ValueError as exc:
            raise ExecutorError(f"ssh_opts / MPK_SSH_OPTS: {exc}") from None
        try:
            self.connect_timeout = int(self.options.get("ssh_connect_timeout") or DEFAULT_CONNECT_TIMEOUT_S)
        except ValueError:
            raise ExecutorError(f"ssh_connect_timeout={self.options['ssh_connect_timeout']}: "
                                "expected whole seconds") from None
        self.ssh = shutil.which("ssh")
        self._fp: GpuFingerprint | None = None
        self._probed = False
        self._absence = f"gpu_host={self.host}: not probed yet"

    # ------------------------------------------------------------ the ssh command
    def ssh_command(self, remote_cmd: str) -> list[str]:
        if self.ssh is None:
            raise ExecutorError("gpu_host= needs the ssh client on this machine (install "
                                "openssh-client)")
        # ssh keeps the first value of each option: BatchMode is forced, the user's options
        # come next so they can change the timeouts, then ours
        return [self.ssh, "-T", "-o", "BatchMode=yes", *self.extra,
                "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR", "--", self.host, remote_cmd]

    def _python_cmd(self, program: str, *args: str) -> str:
        # gpu_python is shell words on purpose (`env X=1 python3`, a conda path)
        return " ".join([self.python, "-c", shlex.quote(program), *map(shlex.quote, args)])

    def _opts_hint(self) -> str:
        return f" [ssh options: {' '.join(self.extra)}]" if self.extra else ""

    # ------------------------------------------------------------ fingerprint
    def probe(self) -> dict:
        """One ssh call: the remote Python, torch version and nvidia-smi rows."""
        cmd = self.ssh_command(self._python_cmd(PROBE))
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=PROBE_TIMEOUT_S + self.connect_timeout)
        except subprocess.TimeoutExpired:
            raise ExecutorError(f"gpu_host={self.host}: no answer within "
                                f"{PROBE_TIMEOUT_S + self.connect_timeout} s (the host or its "
                                f"nvidia-smi hangs){self._opts_hint()}") from None
        if proc.returncode == 255:
            raise ExecutorError(_ssh_error(self.host, proc.stderr, self._opts_hint()))
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("MPK-PROBE ")), None)
        if proc.returncode in (126, 127) or line is None:
            said = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}")
            said = said.splitlines()[-1]
            if proc.returncode in (126, 127):
                raise ExecutorError(f"gpu_python={self.python}: not found on {self.host} ({said}). "
                                    "Install Python 3.10+ with torch there, or set gpu_python= to "
                                    "its path (e.g. gpu_python=/opt/conda/bin/python)")
            raise ExecutorError(f"gpu_python={self.python} on {self.host} did not run the probe "
                                f"({said}): is it a Python 3.10+ interpreter?")
        facts = json.loads(line[len("MPK-PROBE "):])
        major, minor = (int(x) for x in facts["python"].split(".")[:2])
        if (major, minor) < (3, 10):
            raise ExecutorError(f"gpu_python={self.python} on {self.host} is Python {facts['python']}; "
                                "the runners need 3.10 or newer: set gpu_python= to one")
        return facts

    def fingerprint(self) -> GpuFingerprint | None:
        if self._probed:
            return self._fp
        from mpkbuild.run import leases
        facts = self.probe()
        self._probed = True
        rows = parse_smi(facts.get("csv") or "")
        if not rows:
            self._absence = (f"gpu_host={self.host}: " + (facts["smi"] or "nvidia-smi lists no GPU")
                             + " there")
            if self.options.get("gpus"):
                raise ExecutorError(f"gpus={self.options['gpus']}: {self._absence}")
            return None
        gpus = [leases.Gpu(r["index"], r["uuid"], r["name"]) for r in rows]
        try:
            chosen = leases.pick(gpus, self.options.get("gpus"), None, facts.get("visible"))
        except leases.LeaseError as exc:
            raise ExecutorError(f"gpu_host={self.host}: {exc}") from None
        if not chosen:
            self._absence = (f"gpu_host={self.host}: CUDA_VISIBLE_DEVICES={facts.get('visible')} "
                             "there hides every GPU")
            return None
        if facts.get("torch") is None:
            raise ExecutorError(f"gpu_python={self.python} on {self.host} ({facts['executable']}) "
                                "has no torch: install it there (pip install torch) or point "
                                "gpu_python= at a Python that has it")
        first = next(r for r in rows if r["index"] == chosen[0].index)
        same = sum(1 for g in chosen if g.name == first["name"])
        self._fp = GpuFingerprint(name=first["name"], compute_capability=first["compute_cap"],
                                  driver=first["driver_version"],
                                  torch=facts["torch"], count=same)
        return self._fp

    def absence(self) -> str:
        return self._absence

    # ------------------------------------------------------------ one gate
    def run(self, job: GateJob, should_stop=lambda: False) -> dict:
        fp = self.fingerprint()
        data = bundle.pack_for(job, f"gpu_host={self.host}", gpus=self.options.get("gpus"),
                               model=fp.name if fp else None)
        cmd = self.ssh_command(self._python_cmd(remote.BOOTSTRAP, self.workdir))
        limit = job.watchdog_s + MARGIN_S + self.connect_timeout + len(data) / SSH_TRANSFER_BPS
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        out, err = _Pipe(proc.stdout), _Pipe(proc.stderr)
        writer = threading.Thread(target=self._send, args=(proc, remote.frame(data)), daemon=True)
        writer.start()
        try:
            # the one watchdog loop (run/job.watch): the ssh client is the child it kills
            code = watch(_SshChild(proc, self._kill), started + limit, should_stop,
                         f"the build was interrupted; the remote gate on {self.host} was stopped")
            if code is None:
                out.join(1.0)
                job.workdir.mkdir(parents=True, exist_ok=True)
                job.log_file.write_text(out.text() + err.text())
                return {"verdict": "hang", "elapsed_s": round(time.monotonic() - started, 3),
                        "message": f"{job.gate} on {self.host}: no answer within {limit:.0f} s "
                                   f"(the gate's {job.watchdog_s:g} s timeout plus transfer "
                                   "margin); the ssh session was killed, which stops the remote "
                                   f"runner\nlast ssh output:\n{err.text()[-2000:]}"}
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        out.join(5.0)
        err.join(5.0)
        envelope = remote.parse_envelope(out.text())
        if envelope is None:
            if code == 255:
                raise ExecutorError(_ssh_error(self.host, err.text(), self._opts_hint())
                                    + " while the gate ran; nothing was recorded")
            tail = (err.text().strip() or out.text().strip() or "no output")[-2000:]
            how = f"the ssh client was killed by signal {-code}" if code < 0 else \
                f"the remote side ended with status {code}"
            raise ExecutorError(f"gpu_host={self.host}: {how} without an answer; nothing was "
                                f"recorded\n{tail}")
        if "error" in envelope:
            raise ExecutorError(f"gpu_host={self.host}: {envelope['error']}")
        result = bundle.apply_envelope(job, envelope)
        result.setdefault("host", self.host)
        return result

    @staticmethod
    def _send(proc, data: bytes) -> None:
        """Write the framed bundle and keep stdin open: its EOF tells the remote to stop."""
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    @staticmethod
    def _kill(proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
