"""Where GPU gates run. SCons decides *what* runs; an executor only decides *where*.

Every executor has the same three calls: `fingerprint()` (the GPU its gates will run on,
None when there is none; a bad address or host raises ExecutorError within seconds),
`absence()` (why there is no GPU) and `run(job, should_stop)` (the gate's result dict,
never raising for a gate that hung or crashed). `load()` picks one from the command line.
"""
from __future__ import annotations

import importlib
import inspect

BACKENDS = {"local": "mpkbuild.run.local:LocalExecutor",
            "ssh": "mpkbuild.run.remote.ssh:SshExecutor",
            "dask": "mpkbuild.run.remote.dask:DaskExecutor"}


def load(spec: str | None, options: dict | None = None):
    """`local` (default; `ssh` when gpu_host= is given), `ssh`, `dask`, or `module:Class`."""
    options = dict(options or {})
    if not spec:
        spec = "ssh" if options.get("gpu_host") else "local"
    target = BACKENDS.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"executor={spec!r}: expected one of {', '.join(BACKENDS)} or 'module:Class'")
    module, cls = target.split(":", 1)
    factory = getattr(importlib.import_module(module), cls)
    takes_options = bool(inspect.signature(factory).parameters)
    return factory(options) if takes_options else factory()
