"""A stand-in GPU executor for tests only (selected with executor=fake_gpu:FakeGpuExecutor).

It never touches a GPU: it reports a fixed fingerprint (but for FAKE_GPU_NAME and
FAKE_GPU_TORCH) and answers each gate with a result whose verdict the test chooses through
FAKE_GPU_VERDICT (default pass), after sleeping FAKE_GPU_SLEEP seconds. A perf verdict of "timed" answers as the real perf runner does:
figures for every variant (2 us torch, FAKE_GPU_RATIO {variant: time / torch}, default 0.5,
95% of copy bandwidth), which the build then judges against the spec's thresholds. Each
figure carries FAKE_GPU_SAMPLES (default 21) paired samples whose relative noise is
FAKE_GPU_NOISE (default 0.004; a deterministic pattern, so a ratio's interval is known);
each of the spec's perf.baselines gets a figure too, FAKE_GPU_BASELINE {name: us} (2 us). Each run appends one line to $FAKE_GPU_RUNS (when it starts) so
tests can see which gates were really executed. FAKE_GPU_ELAPSED ({kernel: s}) sets the
recorded elapsed_s (the gate order reads it).

The profile gate answers as its runner does under its tool: the variants its section picks
"launched", then the tool's own finish() reads FAKE_GPU_TOOL_REPORT (a file holding what
ncu would have written; default: every variant memory-bound, ncu_report below) into the
result the build judges.

A tune trial (gate "trial") answers from the candidate's configuration: FAKE_GPU_TRIAL_US
{"sym=value[,sym=value]": us} gives the time of the first candidate pattern that holds (10 us
otherwise; the variant's name may be one of the terms), FAKE_GPU_TRIAL_FAIL [pattern, ...]
makes validate fail. Samples are paired with a 20 us torch, with a small fixed jitter. As
the real trial runner does, it times only the job's `figure` against the primary baseline;
its result echoes what the job asked for (`job`: figure, perf section, shipped inputs).

With FAKE_GPU_INSIDE_US {pattern: us} set, a runtime job (the gate's, or the tune's
runtime trial) answers every graph of ours with its head to head: ours at the first
pattern its variant's symbols meet (6 us otherwise), each incumbent at 10 us.
"""
import json
import math
import os
import time

from mpkbuild.gpu import GpuFingerprint


class FakeGpuExecutor:
    name = "fake"

    def fingerprint(self):
        return GpuFingerprint(name=os.environ.get("FAKE_GPU_NAME", "Fake GPU"),
                              compute_capability="9.0", driver="1.0",
                              torch=os.environ.get("FAKE_GPU_TORCH", "0.0"), count=1)

    def absence(self):
        return "fake executor always has a GPU"

    def run(self, job, should_stop=lambda: False):
        result = self._run(job, should_stop)
        took = json.loads(os.environ.get("FAKE_GPU_ELAPSED", "{}"))   # {kernel: seconds to record}
        if job.kernel in took:
            result["elapsed_s"] = took[job.kernel]
        return result

    def _run(self, job, should_stop):
        runs = os.environ.get("FAKE_GPU_RUNS")
        if runs:
            with open(runs, "a") as fh:
                fh.write(f"{job.gate} {job.kernel}\n")
        job.workdir.mkdir(parents=True, exist_ok=True)
        job.log_file.write_text(f"fake {job.gate} run\n")
        sleepy = os.environ.get("FAKE_GPU_SLEEP_GATE")      # only this gate sleeps (default: all)
        sleep = float(os.environ.get("FAKE_GPU_SLEEP", "0")) if sleepy in (None, job.gate) else 0.0
        deadline = time.monotonic() + sleep
        while time.monotonic() < deadline:       # a slow gate, to interrupt
            if should_stop():
                from mpkbuild.run.job import GateInterrupted
                raise GateInterrupted("the build was interrupted; the stand-in gate stopped")
            time.sleep(0.1)
        if job.gate == "trial":
            return _trial(job)
        if job.gate == "runtime" and "FAKE_GPU_INSIDE_US" in os.environ:
            return _inside(job)
        if job.gate == "profile":
            return _profiled(job)
        if job.gate == "bandwidth":
            return {"verdict": "pass", "copy_bandwidth_Bps": 4.0e12, "message": "fake copy 4.00 TB/s",
                    "ceilings_Bps": {"1:1": 4.0e12, "2:1": 4.2e12, "read": 4.4e12}}
        if job.gate in ("validate", "perf"):
            missing = _unresolved(job.payload)
            if missing:                  # what the real runner would fail on (runners/facts.py)
                return {"verdict": "crash", "message": missing}
        verdicts = json.loads(os.environ.get("FAKE_GPU_VERDICT", "{}"))   # {"gate[:kernel]": verdict}
        wanted = verdicts.get(f"{job.gate}:{job.kernel}", verdicts.get(job.gate, "pass"))
        if job.gate == "perf" and wanted == "timed":
            ratios = json.loads(os.environ.get("FAKE_GPU_RATIO", "{}"))
            return {"verdict": "timed", "message": "stand-in perf timed", "copy_bandwidth_Bps": 4.0e12,
                    "variants": {v: _figures(ratios.get(v, 0.5), job.payload["perf"]["perf"])
                                 for v in job.payload["codegen"]["codegen"]["variants"]}}
        return {"verdict": wanted, "message": f"stand-in {job.gate} said {wanted}", "variants": {}}


def _unresolved(payload: dict) -> str | None:
    """Why the job lacks what a runner reads of each variant (its resolved facts), or None."""
    from mpkbuild.runners import facts
    variants = payload["codegen"]["codegen"]["variants"]
    got = payload.get(facts.KEY) or {}
    for v in variants:
        f = got.get(v)
        if f is None or not f["inputs"] or not f["outputs"] or f["grid"] < 1:
            return f"the job has no resolved facts for variant {v!r}"
        if "perf" in payload and (f["bytes"] is None or f["bytes"]["total"] <= 0):
            return f"the perf job has no bytes for variant {v!r}"
    return None


def _samples(us: float, phase: float) -> list[float]:
    n = int(os.environ.get("FAKE_GPU_SAMPLES", "21"))
    noise = float(os.environ.get("FAKE_GPU_NOISE", "0.004"))
    return [us * (1.0 + noise * math.sin(1.7 * j + phase)) for j in range(n)]


def _fig(us: float, phase: float) -> dict:
    """A figure as the real runner makes one (runners/timing.figure), from stand-in samples."""
    from mpkbuild.runners.timing import figure, sampling_info
    samples = _samples(us, phase)
    n = len(samples)
    info = sampling_info(list(range(n)), [None] * n, n, "target", 0.0,
                         {"target": 0.005, "capture_floor": None}, 0.0, None)
    return figure(samples, info)


def _figures(ratio: float, pcfg: dict) -> dict:
    """What the real runner measures (runners/perf.perf_variant), completed by the real
    runner's own complete_variant: the result has its shape (tests/runners/test_fake_gpu.py)."""
    from mpkbuild.runners.perf import complete_variant
    base_us = json.loads(os.environ.get("FAKE_GPU_BASELINE", "{}"))
    hot, base = _fig(2.0 * ratio, 0.0), _fig(2.0, 1.0)
    from mpkbuild.util.perfspec import PRIMARY, baselines as spec_baselines
    baselines = {}
    for b in spec_baselines(pcfg):      # the entries the runner makes (runners/perf.prepared_baselines)
        f = base if b["name"] == PRIMARY else _fig(base_us.get(b["name"], 2.0), 2.0)
        baselines[b["name"]] = {**b, "hot": f, "cold": dict(f)}
    # bytes: what makes 95% of the fake copy bandwidth at this hot time
    nbytes = 0.95 * 4.0e12 * hot["median_us"] * 1e-6
    result = {"bytes": nbytes, "bytes_read": nbytes / 2, "bytes_written": nbytes / 2,
              "ceiling": {"mix": "1:1", "Bps": 4.0e12}, "baselines": baselines,
              "hot": hot, "cold": dict(hot), "cold_sets": 2, "cold_launches": 2,
              "slowcta": {"slowest_task_us": ratio, "all_tasks_us": ratio,
                          "slowest_range_us": [ratio, ratio], "repeats": pcfg["repeats"]}}
    # every placement the same (the stand-in has no allocator): the judged one is fresh
    from mpkbuild.runners import placement
    result["hot"] = {**hot, "placement": "fresh"}
    for b in baselines.values():
        b["hot"] = {**b["hot"], "placement": "fresh"}
    result["hot_placements"] = {
        "statistic": placement.STATISTIC, "working_set_bytes": int(nbytes), "l2_bytes": 60 << 20,
        "sensitive": False,
        "placements": [{"placement": pl.name, "kernel": hot,
                        "baselines": {n: {"median_us": b["hot"]["median_us"], "ratio": ratio}
                                      for n, b in baselines.items()}}
                       for pl in placement.schedule(pcfg.get("placements", 3))]}
    complete_variant(result, ("hot", "cold"))
    result["timings_s"] = {}
    return result


def _holds(pattern: str, variant: str, config: dict) -> bool:
    for term in pattern.split(","):
        if "=" not in term:
            if term != variant:
                return False
            continue
        key, value = term.split("=", 1)
        got = config.get(key)
        got = ("on" if got else "off") if isinstance(got, bool) else str(got)
        if got != value:
            return False
    return True


def _trial(job) -> dict:
    missing = _unresolved(job.payload)
    if missing:
        return {"verdict": "crash", "message": missing}
    cand = job.payload["candidate"]
    variant, config = cand["variant"], cand["config"]
    for pattern in json.loads(os.environ.get("FAKE_GPU_TRIAL_FAIL", "[]")):
        if _holds(pattern, variant, config):
            return {"verdict": "rejected", "check": "validate",
                    "message": f"validate: {variant}: stand-in validate failed ({pattern})"}
    us = 10.0
    for pattern, value in json.loads(os.environ.get("FAKE_GPU_TRIAL_US", "{}")).items():
        if _holds(pattern, variant, config):
            us = float(value)
            break
    repeats = job.payload["perf"]["perf"]["repeats"]
    figure = job.payload["figure"]
    jitter = [1.0 + 0.004 * ((i * 3) % 5 - 2) for i in range(repeats)]
    fig = {"median_us": us, "samples_us": [us * j for j in jitter]}
    base = {"median_us": 20.0, "samples_us": [20.0] * repeats}
    return {"verdict": "timed", "message": "validated and timed (stand-in)",
            "validate": {"verdict": "pass"},
            "job": {"figure": figure, "perf": job.payload["perf"], "inputs": list(job.inputs)},
            "perf": {"verdict": "timed", "variants": {variant: {
                figure: fig, f"baseline_{figure}": base, "baselines": {"torch": {figure: base}}}}}}


def _inside(job) -> dict:
    """The runtime runner's answer for every graph of ours: its head to head against each
    of its incumbents (10 us), ours' makespan the first FAKE_GPU_INSIDE_US pattern that its
    variant's symbols meet (6 us otherwise), the A/A side alike."""
    rt = job.payload["runtime"]
    symbols = rt["kernels"][job.kernel]["codegen"]["variants"]
    table = json.loads(os.environ["FAKE_GPU_INSIDE_US"])
    pairs = rt["pairs"]
    jitter = [1.0 + 0.004 * ((i * 3) % 5 - 2) for i in range(pairs)]
    side = lambda us: {"makespan_us": [us * j for j in jitter], "slowcta_us": [us * j for j in jitter]}
    out = {}
    for g in rt["graphs"]:
        if g.get("role") != "ours":
            continue
        us = next((float(v) for pat, v in table.items() if _holds(pat, g["name"], symbols[g["name"]])), 6.0)
        rivals = [r["incumbent"] for r in rt["graphs"] if r.get("of") == g["name"]]
        out[g["name"]] = {"verdict": "pass", "tasks": 1, "head_to_head": {
            "pairs": pairs, "ours": side(us), "aa": side(us),
            "incumbents": {r: {**side(10.0), "tasks": 1, "numerics": {}} for r in rivals}}}
    return {"verdict": "pass", "message": f"stand-in runtime: {len(out)} graphs", "variants": out,
            "worker": {"registers": 200}}


def _profiled(job):
    from pathlib import Path
    from mpkbuild.runners.facts import PROFILED
    launched = job.payload[PROFILED]
    report = os.environ.get("FAKE_GPU_TOOL_REPORT")
    text = Path(report).read_text() if report else ncu_report(job.kernel, {v: MEMORY_BOUND for v in launched})
    result = {"verdict": "launched", "kernel": job.kernel, "launched": launched,
              "copy_bandwidth_Bps": 4.0e12, "ceilings_Bps": {"1:1": 4.0e12, "2:1": 4.2e12, "read": 4.4e12},
              "message": f"launched {len(launched)} variants"}
    return job.tool.finish(job.wrapper[1], text, 0, result)



# one launch's figures: 10 us moving 36 MB (3.6 TB/s, 90% of the fake 4.0 TB/s 1:1 ceiling)
MEMORY_BOUND = {"duration_ns": 10000, "dram_read_bytes": 18e6, "dram_write_bytes": 18e6, "dram_pct": 88.0,
                "sm_pct": 30.0, "occupancy_pct": 70.0, "stalls": {"long_scoreboard": 5.2, "barrier": 0.4}}
FLOOR_NS = 1500


def ncu_report(kernel: str, variants: dict, floor_ns: float | None = FLOOR_NS, messages=()) -> str:
    """What ncu --csv --page raw --print-units base writes to its log file: its == lines, a
    header, a units row, a row per profiled launch (the empty kernel first)."""
    from mpkbuild.stages.profile import ncu
    stall_cols = sorted({r for v in variants.values() for r in v.get("stalls", {})} | {"selected"})
    metrics = [*ncu.METRICS.values(), *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"
                                        for r in stall_cols)]
    keys = {m: k for k, m in ncu.METRICS.items()}
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
            "Block Size", "Grid Size", "Device", "CC"]
    lines = [*messages, "==PROF== Connected to process 4242 (python3)"]
    rows = [head + metrics, [""] * len(head) + ["nsecond" if "time" in m else "byte" if "bytes" in m
                                                 else "%" if "pct" in m else "" for m in metrics]]
    launches = ([("spin_kernel", {"duration_ns": floor_ns})] if floor_ns else []) + \
        [(f"{kernel}__{v}", fig) for v, fig in variants.items()]
    for i, (name, fig) in enumerate(launches):
        vals = [fig.get(keys[m], 0) if m in keys else
                fig.get("stalls", {}).get(m.split("stalled_")[1].split("_per_issue")[0], 0.01) for m in metrics]
        rows.append([str(i), "4242", "python3", "box", name, "1", "7", "(128, 1, 1)", "(64, 1, 1)", "0", "9.0",
                     *(f"{x:,}" if isinstance(x, (int, float)) else str(x) for x in vals)])
    lines += [",".join(f'"{c}"' for c in r) for r in rows]
    return "\n".join(lines) + "\n"
