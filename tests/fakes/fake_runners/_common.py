"""The body all stand-in runners share (see the package docstring)."""
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import mpkbuild
import mpkbuild.runners  # noqa: F401  (starts the real runners' lifeline from $MPK_LIFELINE_PID)


def _control(gate: str) -> str:
    path = os.environ.get("FAKE_RUNNER_CONTROL")
    if not path:
        return "pass"
    try:
        return json.loads(Path(path).read_text()).get(gate, "pass")
    except (OSError, ValueError):
        return "pass"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _named(job: dict) -> dict:
    """Every file the job names, by where it names it."""
    root = Path(job["root"])
    out = {"root": job["root"]}
    for key in ("library", "bandwidth_file"):
        if job.get(key):
            out[key] = job[key]
    for section, key in (("validate", "reference"), ("perf", "baseline")):
        ref = (job.get(section) or {}).get(section, {}).get(key)
        if ref:
            out[f"{section}.{key}"] = str(root / ref.rsplit(":", 1)[0])
    return out


def _device_name() -> str | None:
    """The model of the GPU this runner was leased, from nvidia-smi (None without one)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    proc = subprocess.run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                          capture_output=True, text=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    for line in proc.stdout.splitlines():
        index, uuid, name = [p.strip() for p in line.split(",", 2)]
        if visible in (None, index, uuid):
            return name
    return None


def main(gate: str) -> None:
    job_file = Path(sys.argv[1])
    job = json.loads(job_file.read_text())
    pids = os.environ.get("FAKE_RUNNER_PIDS")
    if pids:
        with open(pids, "a") as fh:
            fh.write(f"{os.getpid()} {gate} {job.get('kernel')}\n")
    print(f"fake {gate} {job.get('kernel')} on {socket.gethostname()} pid={os.getpid()}", flush=True)
    mode = _control(gate)
    if mode == "hang":
        print("fake runner: spinning forever", flush=True)
        while True:
            time.sleep(1)
    if mode == "crash":
        print("CUDA error: an illegal memory access was encountered", flush=True)
        raise SystemExit(3)
    root = Path(job["root"])
    named = _named(job)
    missing = sorted(k for k, p in named.items() if not Path(p).exists())
    in_bundle = (root / "job.json").is_file()
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) \
        if in_bundle else None
    facts = {"host": socket.gethostname(), "pid": os.getpid(), "root": str(root),
             "in_bundle": in_bundle, "named": named, "missing": missing,
             "bundle_files": files,
             "shipped": {f: _sha256(root / f) for f in files} if files is not None else None,
             "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MPK_GPU_INDEX",
                                                    "MPK_LIFELINE_PID", "MPK_RUNNER_PACKAGE")},
             "mpkbuild": str(Path(mpkbuild.__file__).resolve().parent), "python": sys.executable}
    print(f"fake {gate}: {len(files or [])} files in the bundle, missing: {missing or 'none'}", flush=True)
    if missing:
        verdict, message = "fail", f"fake {gate}: missing {', '.join(missing)}"
    else:
        verdict = "fail" if mode == "fail" else "pass"
        message = f"fake {gate} {verdict} on {facts['host']}"
    result = {"verdict": verdict, "message": message, "fake": facts}
    device = _device_name()
    if device:
        result["device"] = {"name": device}
    if gate == "bandwidth":
        result.update(copy_bandwidth_Bps=4.0e12, message=message + ": fake copy 4.00 TB/s")
    else:
        result["variants"] = {}
    tmp = Path(job["result_file"] + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, job["result_file"])
