"""The profile gate, GPU side: each chosen variant launched once, for Nsight Compute to
measure (the build runs this runner under ncu: stages/profile/ncu.py).

First an empty kernel (torch's spin_kernel for zero cycles): ncu's duration of it is this
GPU's launch floor, which the build's judge holds every variant against. Then each chosen
variant once, on fresh inputs from the spec's generators. The runner measures nothing
itself: its result says what it launched and the GPU's measured ceilings (the bandwidth
node's), and the build adds ncu's figures and judges them (stages/profile/judge.py).
"""
from __future__ import annotations

import fnmatch
import json

import torch

from .common import Harness, device_facts, random_tensor, run_main, tensor_specs


def chosen(job: dict) -> list[str]:
    """The variants the profile section's globs pick, in the spec's order."""
    globs = job["profile"]["profile"]["variants"]
    return [v for v in job["codegen"]["codegen"]["variants"]
            if any(fnmatch.fnmatchcase(v, g) for g in globs)]


def main(job: dict) -> dict:
    torch.cuda.init()
    facts = device_facts()
    bw = json.loads(open(job["bandwidth_file"]).read())
    harness = Harness(job["library"], job["kernel"])
    gens = job["generators"]["generators"]
    gen = torch.Generator(device="cuda").manual_seed(1234)
    torch.cuda._sleep(0)
    torch.cuda.synchronize()
    launched = []
    for variant in chosen(job):
        print(f"profile variant {variant}", flush=True)     # a crash's last line names it
        ins, outs = tensor_specs(job, variant)
        inputs = [random_tensor(shape, dtype, gens.get(name), gen) for name, shape, dtype in ins]
        outputs = [torch.empty(shape, dtype=dtype, device="cuda") for _, shape, dtype in outs]
        harness.launcher(variant)(inputs, outputs)
        torch.cuda.synchronize()
        launched.append(variant)
        del inputs, outputs
    return {"verdict": "launched", "kernel": job["kernel"], "device": facts, "launched": launched,
            "copy_bandwidth_Bps": bw["copy_bandwidth_Bps"], "ceilings_Bps": bw.get("ceilings_Bps"),
            "message": f"launched {len(launched)} variants for ncu"}


if __name__ == "__main__":
    run_main(main)
