"""The profile gate, GPU side: each chosen variant launched once, for Nsight Compute to
measure (the build runs this runner under ncu: stages/profile/ncu.py).

First an empty kernel (torch's spin_kernel for zero cycles): ncu's duration of it is this
GPU's launch floor, which the build's judge holds every variant against. Then each chosen
variant once, on fresh inputs from the spec's generators. The runner measures nothing
itself: its result says what it launched and the GPU's measured ceilings (the bandwidth
node's), and the build adds ncu's figures and judges them (stages/profile/judge.py).
"""
from __future__ import annotations

import json

import torch

from .common import Harness, device_facts, random_tensor, run_main, tensor_specs
from .facts import PROFILED


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
    for variant in job[PROFILED]:       # the section's globs, resolved by the build
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
