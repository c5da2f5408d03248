"""What every GPU runner shares: the job file, the harness library, inputs, results.

A runner's result file is written atomically, and only at the end: a runner that dies
half-way leaves no result, which the executor reports as a crash.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import inspect
import json
import math
import sys
import traceback
from pathlib import Path

import torch

from ..util import config
from ..util.fsutil import write_json_atomic
from . import gpuwait
from .facts import variant as variant_facts

DTYPES = {name: getattr(torch, d["torch"]) for name, d in config.DTYPES.items()}
# Unwritten outputs keep these exact bit patterns (NaN payloads a kernel will not produce).
POISON_BITS = {torch.bfloat16: (torch.int16, 0x7FAB), torch.float16: (torch.int16, 0x7E5B),
               torch.float32: (torch.int32, 0x7FADBEEF), torch.int32: (torch.int32, 0x7EADBEEF),
               torch.int64: (torch.int64, 0x7EADBEEF7EADBEEF)}


class CudaFault(RuntimeError):
    """A CUDA error from a launch or a synchronisation: the verdict is crash."""


def load_job(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    return json.loads(Path(argv[0]).read_text())


def finish(job: dict, result: dict) -> None:
    write_json_atomic(job["result_file"], result)


def device_facts() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", 50 * 2**20),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "wait": gpuwait.wait_mode(torch.cuda.current_device()),
            "work_queues": gpuwait.work_queues()}


def load_function(root: str, ref: str):
    rel, func = ref.rsplit(":", 1)
    path = Path(root) / rel
    name = f"mpk_ref_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # registered as a module, as an import would: torch.compile (Dynamo) looks the
    # function's module up by name and failed with ModuleNotFoundError without this
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, func)


def bind_params(fn, params: dict):
    """fn with the codegen params it accepts by name bound once: the perf gate calls the
    baseline thousands of times while capturing a cold graph, and inspecting its signature
    on every call nearly doubled the Python time per call."""
    sig = inspect.signature(fn)
    return functools.partial(fn, **{k: v for k, v in params.items() if k in sig.parameters})


def call_with_params(fn, tensors, params: dict):
    """Call a reference/baseline with the tensors and the codegen params it accepts by name."""
    out = bind_params(fn, params)(*tensors)
    return list(out) if isinstance(out, (tuple, list)) else [out]


class Harness:
    """The generated library: one extern "C" launcher per variant."""

    def __init__(self, library: str, kernel: str):
        self.lib = ctypes.CDLL(library)
        self.kernel = kernel
        self.lib[f"{kernel}_error_string"].restype = ctypes.c_char_p
        self.lib[f"{kernel}_error_string"].argtypes = [ctypes.c_int]

    def launcher(self, variant: str):
        fn = self.lib[f"{self.kernel}_launch_{variant}"]
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        err = self.lib[f"{self.kernel}_error_string"]

        def launch(inputs, outputs, spans=None, stream=None):
            ins = (ctypes.c_void_p * len(inputs))(*[t.data_ptr() for t in inputs])
            outs = (ctypes.c_void_p * len(outputs))(*[t.data_ptr() for t in outputs])
            if stream is None:
                stream = torch.cuda.current_stream().cuda_stream
            check(fn(ins, outs, spans.data_ptr() if spans is not None else None, stream))

        sets_fn = self.lib[f"{self.kernel}_launch_sets_{variant}"]
        sets_fn.restype = ctypes.c_int
        sets_fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]

        def launch_sets(table, nsets: int, count: int, stream):
            """`count` launches, launch i on set i % nsets of a pointer_table, enqueued by the
            library in one call (the perf gate's cold graphs capture thousands)."""
            check(sets_fn(table, nsets, count, stream))

        worker_fn = self.lib[f"{self.kernel}_launch_worker_{variant}"]
        worker_fn.restype = ctypes.c_int
        worker_fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                              ctypes.c_void_p]

        def launch_worker(inputs, outputs, threads: int) -> int:
            """One launch in worker mode (the harness's MPK-worker-shaped blocks of `threads`,
            several tasks each); the number of blocks it used."""
            ins = (ctypes.c_void_p * len(inputs))(*[t.data_ptr() for t in inputs])
            outs = (ctypes.c_void_p * len(outputs))(*[t.data_ptr() for t in outputs])
            blocks = ctypes.c_int(0)
            check(worker_fn(ins, outs, threads, ctypes.byref(blocks),
                            torch.cuda.current_stream().cuda_stream))
            return blocks.value

        def check(code):
            if code != 0:
                raise CudaFault(f"CUDA error {code} from {self.kernel}_launch_{variant}: "
                                f"{err(code).decode()}")
        launch.sets = launch_sets
        launch.worker = launch_worker
        return launch


def pointer_table(stacked: list[torch.Tensor], count: int):
    """For tensors stacked along a leading set axis, one flat ctypes array, set-major: set j's
    addresses (base + j * each tensor's set stride) in the order given, made without a tensor
    view each."""
    bases = [(t.data_ptr(), t.stride(0) * t.element_size()) for t in stacked]
    for t in stacked:
        assert t.is_contiguous() and t.shape[0] >= count, "set-stacked tensors only"
    return (ctypes.c_void_p * (count * len(stacked)))(
        *[base + j * step for j in range(count) for base, step in bases])


def tensor_specs(side: dict, variant: str) -> tuple[list, list]:
    """(name, shape, torch dtype) of the variant's inputs and outputs, from the facts the
    build resolved (runners/facts.py) in `side` (the job, or one kernel of a runtime job)."""
    facts = variant_facts(side, variant)
    ins = [(t["name"], list(t["shape"]), DTYPES[t["dtype"]]) for t in facts["inputs"]]
    outs = [(t["name"], list(t["shape"]), DTYPES[t["dtype"]]) for t in facts["outputs"]]
    return ins, outs


def random_tensor(shape, dtype, gen_spec: dict | None, generator, lead=(), device="cuda") -> torch.Tensor:
    """Fresh random data from the spec's generator (never zeros)."""
    gen_spec = gen_spec or {"dist": "normal", "mean": 0.0, "std": 1.0}
    full = (*lead, *shape)
    if gen_spec["dist"] == "randint":
        return torch.randint(int(gen_spec["low"]), int(gen_spec["high"]), full, dtype=dtype,
                             device=device, generator=generator)
    t = torch.empty(full, dtype=torch.float32, device=device)
    if gen_spec["dist"] == "normal":
        t.normal_(gen_spec["mean"], gen_spec["std"], generator=generator)
    else:
        t.uniform_(gen_spec["low"], gen_spec["high"], generator=generator)
    if "row_scales" in gen_spec and t.dim() >= 1:
        lo, hi = (math.log(v) for v in gen_spec["row_scales"])
        rows = torch.empty(t.shape[:-1] + (1,), dtype=torch.float32, device=device)
        t.mul_(rows.uniform_(lo, hi, generator=generator).exp_())
    if "step" in gen_spec:
        t.div_(gen_spec["step"]).round_().mul_(gen_spec["step"])
    return t.to(dtype)


def poison_(t: torch.Tensor) -> None:
    view_dtype, bits = POISON_BITS[t.dtype]
    t.view(view_dtype).fill_(bits if bits < 2 ** (t.element_size() * 8 - 1)
                             else bits - 2 ** (t.element_size() * 8))


def unwritten_mask(t: torch.Tensor) -> torch.Tensor:
    view_dtype, bits = POISON_BITS[t.dtype]
    if bits >= 2 ** (t.element_size() * 8 - 1):
        bits -= 2 ** (t.element_size() * 8)
    return t.view(view_dtype) == bits


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    view_dtype = POISON_BITS[a.dtype][0]
    return bool(torch.equal(a.view(view_dtype), b.view(view_dtype)))


def bytes_differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many bytes of two same-shaped tensors differ (what a failed bits_equal reports)."""
    return int((a.view(torch.int8) != b.view(torch.int8)).sum())


def run_main(body, min_work_queues: int = 1, block_while_waiting: bool = True) -> None:
    """Run a runner body; a CUDA fault becomes a crash result with the CUDA error text."""
    job = load_job()
    # before the body's first CUDA call makes the context
    gpuwait.prepare_context(min_work_queues, block_while_waiting)
    try:
        result = body(job)
    except CudaFault as exc:
        result = {"verdict": "crash", "message": str(exc)}
    except torch.cuda.OutOfMemoryError as exc:
        result = {"verdict": "crash", "message": f"CUDA out of memory: {exc}"}
    except RuntimeError as exc:
        text = str(exc)
        if "CUDA" in text or "cuda" in text:
            result = {"verdict": "crash", "message": text.strip().splitlines()[0],
                      "traceback": traceback.format_exc()}
        else:
            raise
    finish(job, result)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after a CUDA fault, freeing device memory can hang.
    import os
    os._exit(0)
