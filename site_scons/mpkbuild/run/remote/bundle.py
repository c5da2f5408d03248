"""A GPU gate as one self-contained archive, and the far side that runs it.

`pack(job)` makes a tar.gz holding `job.json` (the GateJob, with every absolute path into
the tree rewritten relative to the bundle root), exactly the files the gate reads
(`job.inputs`, at their root-relative paths) and this mpkbuild package's source under
`_mpk/`, so the machine that runs it uses the same runner code as the build and needs
nothing of ours installed. Nothing else of the tree travels.

The far side: `unpack(data, workdir)` into a fresh folder under `workdir`, then
`run_unpacked(folder)` points the job's paths at it, leases a GPU of that machine
(leases.py; no lease when it lists none), runs the gate as the local executor does (cold)
and returns an envelope `{"result", "log", "gpu_index", "lease_wait_s", "host", "files"}`;
the caller removes the folder. The ssh backend streams the archive to a `python -c`
bootstrap (bootstrap.py), the dask backend hands the bytes to a worker; both end there.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import tarfile
import tempfile
from pathlib import Path

from mpkbuild.run.job import PACKAGE_PARENT, ExecutorError, GateJob, runner_env
from mpkbuild.run.local import LocalExecutor

FORMAT = 1
JOB_NAME = "job.json"
CODE_DIR = "_mpk"                 # the sys.path entry inside a bundle: _mpk/mpkbuild/...
BUNDLE_DIR, RUN_DIR = "bundle", "run"   # inside the fresh folder: the tree, the job's workdir
LOG_LIMIT = 4 * 2**20             # a runaway log comes back as its last 4 MiB


class BundleError(Exception):
    """The job cannot be packed (a path outside the tree, a missing input) or unpacked."""


# ---------------------------------------------------------------- packing (the build side)
def package_files() -> list[tuple[str, Path]]:
    """The mpkbuild package source as (archive name, file): *.py, templates and the runners'
    CUDA sources (the bandwidth node's streams), no caches."""
    pkg = PACKAGE_PARENT / "mpkbuild"
    out = []
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(pkg)
        if not path.is_file() or "__pycache__" in rel.parts:
            continue
        if path.suffix in (".py", ".cu") or rel.parts[0] == "templates":
            out.append((f"{CODE_DIR}/mpkbuild/{rel.as_posix()}", path))
    return out


def _relativize(value, root: Path | None, where: tuple, found: list):
    """A copy of `value` with absolute paths under `root` made relative ("." for the root);
    the key path of each rewritten string is appended to `found`."""
    if isinstance(value, dict):
        return {k: _relativize(v, root, where + (k,), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_relativize(v, root, where + (i,), found) for i, v in enumerate(value)]
    if isinstance(value, str) and value.startswith("/") and "\n" not in value:
        path = Path(value)
        if root is None:
            raise BundleError(f"payload {'.'.join(map(str, where))} = {value} is an absolute path "
                              "and the job has no root to make it relative to")
        try:
            rel = path.resolve().relative_to(root)
        except ValueError:
            raise BundleError(f"payload {'.'.join(map(str, where))} = {value} lies outside the tree "
                              f"{root}: only files under the tree can be shipped") from None
        found.append(list(where))
        return rel.as_posix() or "."
    return value


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, path: Path | None = None) -> None:
    """Deterministic members: no owner, no mtime; executables stay executable."""
    info = tarfile.TarInfo(name)
    mode = 0o644
    if path is not None:
        data = path.read_bytes()
        if os.stat(path).st_mode & 0o111:
            mode = 0o755
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def manifest(job, options: dict | None = None) -> dict:
    """job.json: the job with tree paths made relative, the inputs' sha256, the options the far
    side needs (gpus=, the GPU model the build is judged for)."""
    root = job_root(job)
    paths: list = []
    payload = _relativize(job.payload, root, (), paths)
    named = {payload_path(payload, p) for p in paths} - {"."}
    inputs = {Path(rel).as_posix() for rel in job.inputs}
    missing_inputs = sorted(n for n in named if root is not None and (root / n).is_file()
                            and n not in inputs)
    if missing_inputs:
        raise BundleError(f"{job.gate} {job.kernel}: the payload names {', '.join(missing_inputs)}, "
                          "which is not among the job's inputs (GateJob.inputs): it would not be shipped")
    files = {}
    for rel in job.inputs:
        if root is None:
            raise BundleError(f"{job.gate} {job.kernel}: inputs given but the job has no root")
        src = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(f"{job.gate} {job.kernel}: input {rel!r} is not a path inside the tree")
        if not src.is_file():
            raise BundleError(f"{job.gate} {job.kernel}: input {rel} does not exist under {root} "
                              "(build its stage first)")
        files[Path(rel).as_posix()] = _sha256(src)
    opts = {k: v for k, v in (options or {}).items() if v is not None}
    return {"format": FORMAT, "gate": job.gate, "kernel": job.kernel, "payload": payload,
            "paths": paths, "timeout_s": job.timeout_s, "inputs": sorted(files), "sha256": files,
            "wrapper": job.wrapper, "share_gpu": job.share_gpu,
            "runner_package": job.runner_package, "preload": list(job.preload), "options": opts}


def job_root(job) -> Path | None:
    """The tree the payload's absolute paths point into: job.root, else payload["root"]."""
    root = job.root or job.payload.get("root")
    return Path(root).resolve() if root else None


def payload_path(payload, where):
    for key in where:
        payload = payload[key]
    return payload


def pack_for(job, where: str, **options) -> bytes:
    """pack() for an executor: a job that cannot be packed is its ExecutorError, naming
    `where` (the host, or the gate)."""
    try:
        return pack(job, options)
    except BundleError as exc:
        raise ExecutorError(f"{where}: {exc}") from None


def pack(job, options: dict | None = None) -> bytes:
    """The job as a tar.gz: job.json, job.inputs at their root-relative paths, mpkbuild's source.
    `options` (gpus=, model=) travel in job.json for the far side's GPU pick."""
    meta = manifest(job, options)
    root = job_root(job)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, JOB_NAME, json.dumps(meta, indent=1, sort_keys=True).encode())
            for rel in meta["inputs"]:
                _add(tar, rel, path=root / rel)
            for name, path in package_files():
                _add(tar, name, path=path)
    return buf.getvalue()


# ---------------------------------------------------------------- the far side
def _safe_members(tar: tarfile.TarFile):
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
            raise BundleError(f"bundle member {m.name!r} is not a plain file inside the bundle")
        yield m


def extract(data: bytes, dest: Path) -> None:
    """Unpack a bundle into `dest` (plain files only, nothing outside it)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = list(_safe_members(tar))
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:                                   # Python < 3.11.4
                tar.extractall(dest, members=members)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"cannot unpack the bundle: {exc}") from None


def default_workdir() -> Path:
    return Path(tempfile.gettempdir()) / f"mpk-gates-{os.getuid()}"


def unpack(data: bytes, workdir: Path | str | None = None) -> Path:
    """A fresh folder under workdir holding bundle/ (the tree) and run/ (the job's workdir)."""
    base = Path(workdir) if workdir else default_workdir()
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="mpk-", dir=base))
    try:
        extract(data, folder / BUNDLE_DIR)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def load_job(folder: Path, timeout_s: float | None = None):
    """The GateJob of an unpacked bundle, its paths pointing into folder/bundle."""
    tree = folder / BUNDLE_DIR
    try:
        meta = json.loads((tree / JOB_NAME).read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle has no readable {JOB_NAME}: {exc}") from None
    if meta.get("format") != FORMAT:
        raise BundleError(f"bundle format {meta.get('format')!r}, this side reads {FORMAT}")
    payload = meta["payload"]
    for where in meta["paths"]:
        parent = payload_path(payload, where[:-1])
        rel = parent[where[-1]]
        parent[where[-1]] = str(tree) if rel == "." else str(tree / rel)
    for rel, digest in meta["sha256"].items():
        if _sha256(tree / rel) != digest:
            raise BundleError(f"bundle file {rel} does not match its sha256: damaged in transit")
    job = GateJob(gate=meta["gate"], kernel=meta["kernel"], payload=payload,
                  workdir=folder / RUN_DIR, timeout_s=float(timeout_s or meta["timeout_s"]),
                  root=tree, inputs=tuple(meta["inputs"]),
                  wrapper=tuple(meta["wrapper"]) if meta.get("wrapper") else None,
                  share_gpu=bool(meta.get("share_gpu")), runner_package=meta.get("runner_package"),
                  preload=tuple(meta.get("preload") or ()))
    return job, meta.get("options") or {}


def _read_tail(path: Path, limit: int = LOG_LIMIT) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return text if size <= limit else f"[first {size - limit} bytes of the log cut]\n{text}"


def run_unpacked(folder: Path, should_stop=lambda: False, timeout_s: float | None = None) -> dict:
    """Run an unpacked bundle's gate on this machine as the local executor runs one (a GPU
    lease, cold); the envelope. Raises GateInterrupted when should_stop() turns true (the
    runner is killed)."""
    job, options = load_job(folder, timeout_s)
    # the runner imports the bundle's own mpkbuild first, even when this process (a dask
    # worker, say) imported another copy
    env = {"PYTHONPATH": os.pathsep.join([str(job.root / CODE_DIR), runner_env()["PYTHONPATH"]])}
    executor = LocalExecutor({"gpus": options.get("gpus"), "warm": "0"}, model=options.get("model"), env=env)
    try:
        result = executor.run(job, should_stop)
    except ExecutorError as exc:
        return {"error": f"{socket.gethostname()}: {exc}"}
    files = {}
    for path in sorted(job.workdir.iterdir()) if job.workdir.is_dir() else ():
        if path.is_file() and path != job.log_file and not path.name.startswith("."):
            files[path.name] = _read_tail(path)        # e.g. the wrapping tool's report
    return {"result": result, "log": _read_tail(job.log_file),
            "gpu_index": result.get("gpu_index"), "lease_wait_s": result.get("lease_wait_s"),
            "host": socket.gethostname(), "files": files}


def apply_envelope(job, envelope: dict) -> dict:
    """On the build side: write the log (and any report files) where the local executor
    would have, and return the gate's result with where it ran."""
    job.workdir.mkdir(parents=True, exist_ok=True)
    job.log_file.write_text(envelope.get("log") or "")
    for name, text in (envelope.get("files") or {}).items():
        if "/" not in name and not name.startswith("."):
            (job.workdir / name).write_text(text)
    result = dict(envelope["result"])
    for key in ("gpu_index", "lease_wait_s", "host"):
        if envelope.get(key) is not None:
            result.setdefault(key, envelope[key])
    return result
