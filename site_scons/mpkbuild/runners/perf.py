"""The perf gate, GPU side: graph-timed hot and cold figures, slowCTA, the torch baseline.

- hot: one buffer set, `launches_per_graph` launches per replay (data may sit in L2), timed
  once per buffer placement (runners/placement.py: `perf.placements`) and judged on the
  worst;
- cold: buffer sets rotated so that more than twice the L2 is touched between reuses;
- slowCTA: the harness records each task's %globaltimer begin/end; the slowest span;
- baselines: each of the spec's baselines (the primary `perf.baseline`, named torch, and
  `perf.baselines`: other callables, torch.compile'd ones compiled before timing) captured
  and timed the same way on the same inputs, all replays interleaved with the kernel's;
  vs_<figure> is the median of the paired ratios with its interval (util.stats);
- sampling: to a noise criterion with each sample's SM clock (timing.time_graphs); the
  GPU's clocks, power limit, temperature and throttle reasons at the start and end (NVML);
- bandwidth: the spec's bytes per launch over the time, against the GPU's measured ceiling
  for the spec's read:write mix (the bandwidth node's result, util.perfspec.ceiling).
The runner only times; the build turns the figures into the verdict with the spec's
thresholds (mpkbuild/stages/perf/judge.py), also when several GPUs shared the gate's variants.

A tune trial (runners/trial.py) times through the same functions with `only_figure`: that
one figure (hot or cold, the tune's `figure`), the kernel paired with the primary baseline
alone; no other baseline is loaded or compiled, no slowCTA, no other figure. Candidates are
compared on nothing else (stages/tune/), so the rest would only cost GPU time.
"""
from __future__ import annotations

import json
import math
import statistics
import time

import torch

from ..util import perfspec
from .facts import variant as variant_facts
from . import placement
from .common import (Harness, bind_params, device_facts, load_function, pointer_table,
                     random_tensor, run_main, tensor_specs)
from .gpustate import Nvml
from .timing import capture, each, paired_figure, paired_ratio, time_graphs

MAX_COLD_LAUNCHES = 8192


def _sets(specs, gens, count, generator):
    return [random_tensor(shape, dtype, gens.get(name), generator, lead=(count,))
            for name, shape, dtype in specs]


def timed_generators(job: dict) -> dict:
    """The spec's generators with perf.generators over them: validate's edge cases (e.g.
    out-of-range ids) are not what the timed launches should see."""
    return {**job["generators"]["generators"], **job["perf"]["perf"].get("generators", {})}


def slow_cta(launch, inputs, outputs, grid: int, repeats: int) -> dict:
    spans = torch.zeros(2 * grid, dtype=torch.int64, device="cuda")
    slowest, whole = [], []
    for _ in range(repeats):
        launch(inputs, outputs, spans=spans)
        torch.cuda.synchronize()
        s = spans.view(grid, 2).cpu()
        dur = (s[:, 1] - s[:, 0]).double()
        slowest.append(dur.max().item() / 1000.0)
        whole.append((s[:, 1].max() - s[:, 0].min()).item() / 1000.0)
    # the spread over repeats: the review compares it with the runtime gate's (stages/review.py)
    return {"slowest_task_us": statistics.median(slowest), "all_tasks_us": statistics.median(whole),
            "slowest_range_us": [min(slowest), max(slowest)], "repeats": repeats}


def prepared_baselines(job: dict, codegen: dict, inputs: list, primary_only: bool = False) -> list[dict]:
    """Each baseline as a callable on the kernel's inputs: the spec's functions with their
    params bound, torch.compile'd ones (dynamic=False) compiled here on the variant's inputs
    (the compile time recorded, never timed). A fresh dynamo cache per variant: with one
    cache, shapes past its recompile limit would silently run eagerly. `primary_only`: the
    primary baseline alone (`perf.baseline`, never compiled); the others are not loaded."""
    out = []
    for b in perfspec.baselines(job["perf"]["perf"])[:1 if primary_only else None]:
        fn = bind_params(load_function(job["root"], b["function"]), codegen["params"])
        entry = {"name": b["name"], "function": b["function"], "compile": b["compile"], "mode": b.get("mode")}
        if b["compile"]:
            torch._dynamo.reset()
            mode = None if b.get("mode") in (None, "default") else b["mode"]
            compiled = torch.compile(fn, dynamic=False, mode=mode)
            started = time.perf_counter()
            try:
                compiled(*inputs)
                torch.cuda.synchronize()
            except Exception as exc:     # recorded, shown by the review; never timed as eager
                entry["error"] = f"torch.compile failed: {type(exc).__name__}: {str(exc)[:300]}"
                print(f"baseline {b['name']}: {entry['error']}", flush=True)
                out.append(entry)
                continue
            entry["compile_s"] = round(time.perf_counter() - started, 3)
            fn = compiled
        entry["fn"] = fn
        out.append(entry)
    return out


class _Phases:
    """Where the gate's own time goes (not the kernel's): seconds per phase."""

    def __init__(self):
        self.seconds, self._at = {}, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._at, 4)
        self._at = now


def perf_variant(harness, job, variant, bandwidth, l2_bytes, nvml=None, only_figure: str | None = None) -> dict:
    """The variant's figures. `only_figure` ("hot" or "cold", a tune trial's): that figure
    alone, against the primary baseline alone, and no slowCTA (see the module docstring)."""
    codegen, pcfg = job["codegen"]["codegen"], job["perf"]["perf"]
    if only_figure not in (None, "hot", "cold"):
        raise ValueError(f"only_figure {only_figure!r}: hot, cold or None")
    figures = (only_figure,) if only_figure else ("hot", "cold") if pcfg["cold"] else ("hot",)
    gens = timed_generators(job)
    launch = harness.launcher(variant)
    ins, outs = tensor_specs(job, variant)
    facts = variant_facts(job, variant)
    nbytes, nread, nwrite = facts["bytes"]["total"], facts["bytes"]["read"], facts["bytes"]["write"]
    gen = torch.Generator(device="cuda").manual_seed(1234)
    phases = _Phases()

    def timed(kernel, others, launches: int, warmup: int, prime: bool) -> list[dict]:
        graphs = [capture(kernel, launches)] + [capture(o, launches) for o in others]
        phases.lap("capture")
        out = time_graphs(graphs, launches, pcfg["repeats"], warmup, prime, pcfg.get("sampling"), nvml)
        phases.lap("replay")
        return out

    # hot: one buffer set (the baselines are compiled on it)
    inputs = [t[0] for t in _sets(ins, gens, 1, gen)]
    outputs = [torch.empty(shape, dtype=dtype, device="cuda") for _, shape, dtype in outs]
    phases.lap("inputs")
    prepared = prepared_baselines(job, codegen, inputs, primary_only=only_figure is not None)
    bases = [b for b in prepared if "fn" in b]
    phases.lap("compile")
    result = {"bytes": nbytes, "bytes_read": nread, "bytes_written": nwrite,
              "ceiling": perfspec.ceiling(bandwidth, nread, nwrite),
              "baselines": {b["name"]: {k: v for k, v in b.items() if k != "fn"} for b in prepared}}
    if "hot" in figures:
        # once per placement (runners/placement.py), on copies of the same inputs; a tune
        # trial compares candidates on the fresh placement alone
        count = 1 if only_figure else pcfg.get("placements", 3)
        _hot(result, timed, launch, inputs, outputs, bases, pcfg, count, l2_bytes)
        phases.lap("placements")
    if only_figure is None:
        result["slowcta"] = slow_cta(launch, inputs, outputs, facts["grid"], pcfg["repeats"])
        phases.lap("slowcta")
    if "cold" in figures:
        _cold(result, timed, launch, ins, outs, gens, gen, bases, pcfg, l2_bytes, phases)
    del bases
    complete_variant(result, figures)
    result["timings_s"] = phases.seconds
    return result


def _hot(result: dict, timed, launch, inputs, outputs, bases, pcfg: dict, count: int, l2_bytes: int) -> None:
    """The hot figure, one buffer set replayed, once per buffer placement: ours judged on
    its worst placement, each baseline's ratio on the placement where it is highest."""
    per = []
    for pl in placement.schedule(count):
        with placement.arranged(pl, l2_bytes, torch):
            p_in = inputs if pl.name == "fresh" else [t.clone() for t in inputs]
            p_out = outputs if pl.name == "fresh" else [torch.empty_like(o) for o in outputs]
            figs = timed(each(lambda i, s, a=p_in, o=p_out: launch(a, o, stream=s)),
                         [each(lambda i, s, f=b["fn"], a=p_in: f(*a)) for b in bases],
                         pcfg["launches_per_graph"], pcfg["warmup"], prime=True)
            del p_in, p_out
        per.append({"placement": pl.name, "kernel": figs[0],
                    "baselines": {b["name"]: f for b, f in zip(bases, figs[1:])}})
    judged = max(per, key=lambda e: e["kernel"]["median_us"])      # the worst placement
    result["hot"] = {**judged["kernel"], "placement": judged["placement"]}
    for b in bases:
        name = b["name"]
        pick = max(per, key=lambda e: paired_ratio(e["kernel"], e["baselines"][name]))
        result["baselines"][name]["hot"] = {**pick["baselines"][name], "placement": pick["placement"]}
    nbytes = result["bytes"]
    result["hot_placements"] = {
        # what one launch touches (perf.bytes): an embedding's table is not its working set
        "statistic": placement.STATISTIC, "working_set_bytes": nbytes, "l2_bytes": l2_bytes,
        "sensitive": placement.sensitive(nbytes, l2_bytes),
        "placements": [{"placement": e["placement"], "kernel": e["kernel"],
                        "baselines": {n: {"median_us": f["median_us"],
                                          "ratio": paired_ratio(e["kernel"], f)}
                                      for n, f in e["baselines"].items()}} for e in per]}


def _cold(result: dict, timed, launch, ins, outs, gens, gen, bases, pcfg: dict, l2_bytes: int,
          phases: _Phases) -> None:
    """The cold figure: a new buffer set per launch, enough sets for twice the L2 per replay."""
    L = pcfg["launches_per_graph"]
    set_bytes = sum(math.prod(s) * torch.empty((), dtype=d).element_size() for _, s, d in ins + outs)
    nsets = max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)
    n_launch = min(MAX_COLD_LAUNCHES, max(L, nsets))
    nsets = min(nsets, n_launch)
    in_sets = _sets(ins, gens, nsets, gen)
    out_sets = [torch.empty((nsets, *shape), dtype=dtype, device="cuda") for _, shape, dtype in outs]
    table = pointer_table(in_sets + out_sets, nsets)
    set_inputs = [[t[j] for t in in_sets] for j in range(nsets)]     # the baselines' views
    phases.lap("inputs")
    figs = timed(lambda count, s: launch.sets(table, nsets, count, s),
                 [each(lambda i, s, f=b["fn"]: f(*set_inputs[i % nsets])) for b in bases], n_launch, 0,
                 prime=False)     # 2x the L2 per replay: what ran before weighs little
    result.update(cold=figs[0], cold_sets=nsets, cold_launches=n_launch)
    for b, f in zip(bases, figs[1:]):
        result["baselines"][b["name"]]["cold"] = f
    del in_sets, out_sets, set_inputs


def complete_variant(result: dict, figures) -> dict:
    """What a variant's result derives from its timed figures: bandwidth and its fraction
    of the ceiling, each baseline's paired comparison, the primary baseline's figure and
    ratio. The stand-in GPU executor of the tests completes its figures with this too, so
    its results have the real runner's shape."""
    for key in figures:
        bw = result["bytes"] / (result[key]["median_us"] * 1e-6)
        result[f"{key}_bandwidth_Bps"] = bw
        result[f"{key}_bandwidth_fraction"] = bw / result["ceiling"]["Bps"]
        for b in result["baselines"].values():
            if key in b:
                b[f"vs_{key}"] = paired_figure(perfspec.paired_kernel(result, key, b[key]), b[key])
    primary = result["baselines"][perfspec.PRIMARY]
    for key in figures:                               # the primary baseline, as before
        result[f"baseline_{key}"] = primary[key]
        result[f"vs_baseline_{key}"] = paired_ratio(perfspec.paired_kernel(result, key, primary[key]), primary[key])
    return result


def main(job: dict, only_figure: str | None = None) -> dict:
    """Times every variant and reports them as "timed": the build applies the spec's
    thresholds (stages/perf/judge.py). `only_figure`: a tune trial's (perf_variant)."""
    torch.cuda.init()
    facts = device_facts()
    nvml = Nvml()
    state = {"start": nvml.snapshot()}
    bw = json.loads(open(job["bandwidth_file"]).read())
    copy_bw = bw["copy_bandwidth_Bps"]
    harness = Harness(job["library"], job["kernel"])
    variants = {}
    for variant in job["codegen"]["codegen"]["variants"]:
        print(f"perf variant {variant}", flush=True)      # a crash's last line names it
        variants[variant] = perf_variant(harness, job, variant, bw, facts["l2_bytes"], nvml,
                                         only_figure=only_figure)
        started = time.perf_counter()
        # Every variant starts from fresh allocations: with torch's cache kept between
        # variants, linear_v2's L2-resident decode shapes measured up to 1.35x slower on an
        # H200 (the same kernels, 0.96-1.03x with this), so a variant's figure depended on
        # which variants ran before it.
        torch.cuda.empty_cache()
        variants[variant]["timings_s"]["free"] = round(time.perf_counter() - started, 4)
    state["end"] = nvml.snapshot()
    return {"verdict": "timed", "device": facts, "copy_bandwidth_Bps": copy_bw,
            "ceilings_Bps": bw.get("ceilings_Bps"), "gpu_state": state,
            "variants": variants, "message": f"timed {len(variants)} variants"}


if __name__ == "__main__":
    run_main(main)
