"""The validate gate, GPU side: every variant against the float64 torch reference.

Per trial: fresh random inputs (seed recorded), outputs poisoned before every step, the
reference computed in float64 from the same inputs. A step fails on unwritten elements,
NaN where the reference is finite, cos below / relative error above the spec's limits (or
any difference in exact mode); the steps run on the same buffers must also agree bit for
bit (a moving result is a race or leftover state). Last, one launch in worker mode (the
harness's blocks shaped as MPK's worker: more threads than the body's, several tasks each,
SMEM left dirty) must give the same bits: the body contract, tested on the GPU without a
checkout.
"""
from __future__ import annotations

import math
import os
import time

import torch

from ..util.config import WORKER_MODE_BLOCKS
from .common import (CudaFault, Harness, bits_equal, bytes_differing, call_with_params, device_facts,
                     load_function, poison_, random_tensor, run_main, tensor_specs, unwritten_mask)


def compare(out: torch.Tensor, ref: torch.Tensor, vcfg: dict) -> tuple[dict, str | None]:
    """Numbers for one output and the first failed check (None when it passes)."""
    unwritten = int(unwritten_mask(out).sum())
    if unwritten:
        idx = int(unwritten_mask(out).flatten().nonzero()[0])
        return {"unwritten": unwritten}, (f"output not fully written: {unwritten} of {out.numel()} "
                                          f"elements still hold the poison (first at flat index {idx})")
    if vcfg["compare"] == "exact":
        want = ref.to(out.dtype)
        diff = int((out != want).sum())
        if diff:
            idx = int((out != want).flatten().nonzero()[0])
            return {"mismatches": diff}, (f"exact compare: {diff} of {out.numel()} elements differ "
                                          f"(first at flat index {idx}: got {out.flatten()[idx].item()}, "
                                          f"want {want.flatten()[idx].item()})")
        return {"mismatches": 0}, None
    o = out.to(torch.float64).flatten()
    r = ref.to(torch.float64).flatten()
    nan = int((torch.isnan(o) & ~torch.isnan(r)).sum())
    if nan or bool(torch.isinf(o).logical_and(~torch.isinf(r)).any()):
        return {"nan": nan}, f"{nan} NaN/Inf elements where the reference is finite"
    denom = (o.norm() * r.norm()).item()
    cos = 1.0 if denom == 0 and o.norm().item() == r.norm().item() else (o @ r).item() / denom if denom else 0.0
    ref_max = r.abs().max().item()
    err_max = (o - r).abs().max().item()
    rel = err_max / ref_max if ref_max else (0.0 if err_max == 0 else math.inf)
    numbers = {"cos": cos, "rel": rel, "max_abs_err": err_max}
    if not cos >= vcfg["cos_min"]:
        return numbers, f"cos {cos:.6f} < cos_min {vcfg['cos_min']}"
    if not rel <= vcfg["rel_max"]:
        return numbers, f"rel {rel:.3e} > rel_max {vcfg['rel_max']:.3e} (max |out-ref| / max |ref|)"
    if vcfg.get("per_row") and out.dim() >= 2:
        # each row against its own largest value: a row far smaller than the largest (a
        # near-zero row of a norm) hides a wrong eps or scale from the figures above
        o2 = o.reshape(-1, out.shape[-1])
        r2 = r.reshape(-1, out.shape[-1])
        scale = r2.abs().amax(dim=1)
        scale = torch.where(scale > 0, scale, torch.full_like(scale, ref_max or 1.0))
        per_row = (o2 - r2).abs().amax(dim=1) / scale
        worst = int(per_row.argmax())
        numbers.update(row_rel=per_row[worst].item(), worst_row=worst)
        if not per_row[worst].item() <= vcfg["rel_max"]:
            return numbers, (f"row {worst}: rel {per_row[worst].item():.3e} > rel_max "
                             f"{vcfg['rel_max']:.3e} (max |out-ref| / max |ref| within the row; "
                             f"its largest |ref| is {scale[worst].item():.3e}, the output's {ref_max:.3e})")
    return numbers, None


def validate_variant(harness: Harness, job: dict, variant: str) -> dict:
    codegen, vcfg = job["codegen"]["codegen"], job["validate"]["validate"]
    launch = harness.launcher(variant)
    reference = load_function(job["root"], vcfg["reference"])
    ins, outs = tensor_specs(job, variant)
    worst = {"cos": 1.0, "rel": 0.0}
    trials = []
    for trial in range(vcfg["trials"]):
        seed = int.from_bytes(os.urandom(6), "little")
        gen = torch.Generator(device="cuda").manual_seed(seed)
        inputs = [random_tensor(shape, dtype, job["generators"]["generators"].get(name), gen)
                  for name, shape, dtype in ins]
        for (name, _, _), t in zip(ins, inputs):
            if not bool(t.ne(0).any()):
                return {"verdict": "fail", "check": "inputs", "trial": trial, "seed": seed,
                        "message": f"generator for input {name!r} produced only zeros"}
        refs = call_with_params(reference, [t.to(torch.float64) for t in inputs], codegen["params"])
        if len(refs) != len(outs):
            return {"verdict": "fail", "check": "reference", "message":
                    f"reference returned {len(refs)} tensors, the spec declares {len(outs)} outputs"}
        outputs = [torch.empty(shape, dtype=dtype, device="cuda") for _, shape, dtype in outs]
        previous = None
        for step in range(vcfg["steps"]):
            for o in outputs:
                poison_(o)
            # the last line a hang or a crash leaves in the log says where it was
            print(f"validate {variant} trial {trial} step {step}", flush=True)
            launch(inputs, outputs)
            torch.cuda.synchronize()
            for (name, shape, _), out, ref in zip(outs, outputs, refs):
                if list(ref.shape) != list(shape):
                    return {"verdict": "fail", "check": "reference", "message":
                            f"reference output {name!r} has shape {list(ref.shape)}, spec says {shape}"}
                numbers, problem = compare(out, ref, vcfg)
                if problem:
                    return {"verdict": "fail", "check": "numeric", "trial": trial, "step": step,
                            "seed": seed, "output": name, "numbers": numbers,
                            "message": f"trial {trial} step {step} output {name}: {problem}"}
                worst["cos"] = min(worst["cos"], numbers.get("cos", 1.0))
                worst["rel"] = max(worst["rel"], numbers.get("rel", 0.0))
            current = [o.clone() for o in outputs]
            if previous is not None:
                for (name, _, _), a, b in zip(outs, previous, current):
                    if not bits_equal(a, b):
                        diff = bytes_differing(a, b)
                        return {"verdict": "fail", "check": "determinism", "trial": trial,
                                "step": step, "seed": seed, "output": name,
                                "message": f"trial {trial}: output {name} differs bitwise between "
                                           f"step {step - 1} and step {step} on the same inputs "
                                           f"({diff} bytes): a race or state left from the previous step"}
            previous = current
        # worker mode: the same inputs as MPK's worker would run them, in blocks of v1's
        # size and of Runtime-V2's; bit for bit the steps' result, so a body that depends
        # on the block it runs in cannot pass
        used = {}
        for threads in WORKER_MODE_BLOCKS:
            for o in outputs:
                poison_(o)
            print(f"validate {variant} trial {trial} worker mode, {threads} threads", flush=True)
            blocks = used[threads] = launch.worker(inputs, outputs, threads)
            torch.cuda.synchronize()
            mode = (f"worker mode ({threads}-thread blocks, the body on the first "
                    f"{codegen['threads']}, {blocks} block(s) running the tasks in turn)")
            for (name, _, _), out, ref, want in zip(outs, outputs, refs, previous):
                numbers, problem = compare(out, ref, vcfg)
                if problem is None and not bits_equal(out, want):
                    diff = bytes_differing(out, want)
                    problem = (f"differs bitwise from the one-task-per-block launch on the same "
                               f"inputs ({diff} bytes)")
                if problem:
                    return {"verdict": "fail", "check": "worker", "trial": trial, "seed": seed,
                            "output": name, "numbers": numbers, "worker_threads": threads,
                            "message": f"trial {trial} {mode}: output {name}: {problem}: the body "
                                       "depends on the block it runs in (blockDim, a whole-block "
                                       "barrier, SMEM it did not write), which MPK's worker does "
                                       "not give it"}
        trials.append({"seed": seed, "steps": vcfg["steps"], "worker_blocks": used[WORKER_MODE_BLOCKS[0]]})
    return {"verdict": "pass", "cos_min_seen": worst["cos"], "rel_max_seen": worst["rel"],
            "trials": trials, "worker_threads": list(WORKER_MODE_BLOCKS)}


def main(job: dict) -> dict:
    clock = [time.perf_counter()]
    torch.cuda.init()
    torch.empty(1, device="cuda")                 # the context really exists from here
    clock.append(time.perf_counter())
    harness = Harness(job["library"], job["kernel"])
    clock.append(time.perf_counter())
    variants, failed = {}, []
    for variant in job["codegen"]["codegen"]["variants"]:
        try:
            res = validate_variant(harness, job, variant)
        except RuntimeError as exc:          # a CUDA fault: say in which variant
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if isinstance(exc, CudaFault) or "cuda" in text.lower():
                raise CudaFault(f"{variant}: {text}") from exc
            raise
        variants[variant] = res
        if res["verdict"] != "pass":
            failed.append(f"{variant}: {res['message']}")
    clock.append(time.perf_counter())
    return {"verdict": "fail" if failed else "pass", "device": device_facts(),
            "timings_s": {name: round(b - a, 3) for name, a, b in
                          zip(("cuda_init", "load_library", "variants"), clock, clock[1:])},
            "variants": variants, "message": "; ".join(failed) if failed else "all variants pass",
            "limits": {k: job["validate"]["validate"][k]
                       for k in ("compare", "cos_min", "rel_max", "trials", "steps")}}


if __name__ == "__main__":
    run_main(main)
