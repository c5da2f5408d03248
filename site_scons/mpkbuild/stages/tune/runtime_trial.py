"""Tune on the verdict-grade figure (`tune.figure: runtime`, issue 58 item 3).

The harness has ranked configurations differently from the runtime before (bench/RESULTS.md
section 16), and the runtime's is the verdict. So, after every candidate's harness trial
(validate, and the harness figure timed for corroboration), one node per kernel and GPU
profile builds the runtime gate's megakernel from the survivors: per tuned variant the
spec's configuration, the RUNTIME_CANDIDATES others fastest in the harness and the fastest
of each further task count (up to as many again: chosen()), each a variant of its own beside
its incumbent, in the production-shaped worker. The runtime gate's
runner sets each up beside its incumbent and times them in alternating rounds with the A/A
floor; the pick ranks a variant's candidates by ours / incumbent makespan inside MPK, and
the tuned file says that figure decided.
"""
from __future__ import annotations

import os
from pathlib import Path

from mpkbuild.util.expr import grid_size, variant_symbols
from mpkbuild.util.fsutil import read_json, sha256_json, write_atomic
from mpkbuild.stages.tune.section import harness_figure
from mpkbuild.stages.tune.space import Candidate, space
from mpkbuild.stages.tune.trials import ledger_entry, trial_result

# per tuned variant, besides the spec's own configuration, the candidates fastest in the
# harness that the runtime trial times (and as many again at most, one a task count: chosen()):
# each is another instantiation of the body in one worker (and another graph to time), so the
# search inside MPK is narrowed by the harness
RUNTIME_CANDIDATES = 3
TIMEOUT_S = 900.0


def runtime_dir(k, gpu_key: str) -> Path:
    return k.gpu_dir(gpu_key) / "tune" / "runtime"


def result_path(k, gpu_key: str) -> Path:
    return runtime_dir(k, gpu_key) / "runtime_trial.json"


def graph_name(cand: Candidate) -> str:
    """The candidate as a variant of the trial's megakernel (a C identifier)."""
    return f"{cand.variant}__{cand.cid.rsplit('-', 1)[1]}"


def chosen(k, gpu_key: str) -> list[Candidate]:
    """The candidates the runtime trial times: per variant the spec's configuration (when
    its harness trial timed it), the RUNTIME_CANDIDATES others with the lowest harness ratio,
    and then, up to RUNTIME_CANDIDATES more, the harness's fastest of each task count not yet
    among them. What a task costs inside MPK (its dispatch, and a start spread that grows
    with the count: bench/RESULTS.md section 31) is what the harness cannot see, so a
    configuration with fewer, fuller tasks can win there from the harness's last place
    (rmsnorm_v2 decode_r8: 2 rows a task, 9% slower in the harness, 0.59x MPK's makespan
    against one row's 0.99x inside it)."""
    figure = harness_figure(k.base.data)
    cg = k.base.data["codegen"]
    tasks = lambda c: grid_size(cg, {**variant_symbols(cg, c.variant), **c.values})  # noqa: E731
    out = []
    for entry in space(k.base.data).values():
        timed = []
        for cand in entry["candidates"]:
            row = ledger_entry(read_json(trial_result(k, gpu_key, cand)), cand, figure, "")
            if row["verdict"] == "timed":
                timed.append((not cand.current, row["ratio"]["median"], cand))
        timed.sort(key=lambda t: t[:2])
        picked = [c for _, _, c in timed[:1 + RUNTIME_CANDIDATES]]
        counts = {tasks(c) for c in picked}
        for _, _, cand in timed[1 + RUNTIME_CANDIDATES:]:          # by harness ratio
            if len(picked) == 1 + 2 * RUNTIME_CANDIDATES:
                break
            if tasks(cand) not in counts:
                counts.add(tasks(cand))
                picked.append(cand)
        out += picked
    return out


def trial_runtime(data: dict) -> dict:
    """What the runtime trial reads of the spec's runtime section: all of it but the blocks
    and thresholds, each candidate against the incumbent as the builder configures it (one
    fixed yardstick). It is what the trial node and the tuned file's key sign, so a threshold
    or block edit re-runs no trial and stales no tuned file, and a memory, pairs, composition
    or incumbent edit does both."""
    runtime = data["runtime"]
    return {**runtime, "blocks": [], "thresholds": [],
            "incumbent": [{**rule, "best": False} for rule in runtime["incumbent"]]}


def derived_kernel(k, cands: list[Candidate]):
    """k with the candidates as its variants (graph_name) and trial_runtime's runtime
    section: what the runtime gate's megakernel and runner are made from."""
    from mpkbuild.stages.runtime import kernel_with
    cg = k.base.data["codegen"]
    return kernel_with(k, {graph_name(c): {**cg["variants"][c.variant], **c.values} for c in cands},
                       trial_runtime(k.base.data))


def run_runtime_trial(build, info, target, source) -> int:
    """Build the survivors' megakernel and run the runtime gate's runner on it; the result
    holds each candidate's in-runtime figures against its incumbent."""
    from mpkbuild.run.job import GateJob
    from mpkbuild.stages import table as stages
    from mpkbuild.stages.gates import GateCannotRun, lock_for, python_files, record
    from mpkbuild.stages.runtime import build_in, judge, megakernel
    k = build.kernels[info["MPK_KERNEL"]]
    request = build.runtime_request
    if request is None or request.checkout is None:
        return build.fail(f"tune {k.name}: tune.figure: runtime times candidates inside MPK: give "
                          "mpk_root=PATH (an MPK checkout), as stage=runtime needs")
    try:
        fp = build.ready_gpu(k.name, "tune")
    except GateCannotRun as exc:
        return build.fail(str(exc))
    out, log = Path(target[0].abspath), Path(target[1].abspath)
    work = out.parent
    cands = chosen(k, fp.key)
    if not cands:
        result = {"verdict": "fail", "message": "no candidate passed its harness trial", "candidates": {}}
    else:
        trial = derived_kernel(k, cands)
        ok, text, took, lib = build_in(trial, work, request.checkout, request.runtime)
        if not ok:
            result = {"verdict": "fail", "message": f"the trial's megakernel did not compile ({took:.0f} s): "
                      + " ".join(l for l in text.splitlines() if "error" in l)[:600], "candidates": {}}
        else:
            payload = {"root": str(k.root), "library": str(lib), "kernel": k.name,
                       "runtime": megakernel.job_payload(trial, build)}
            files_read = [lib, *python_files(k, stages.BY_NAME["runtime"].gate)]
            job = GateJob("runtime", k.name, payload, work, TIMEOUT_S, root=k.root,
                          inputs=tuple(dict.fromkeys(os.path.relpath(p, k.root) for p in files_read)),
                          preload=stages.runner_names())
            try:
                ran = build.run_gate(job)
            except GateCannotRun as exc:
                return build.fail(str(exc))
            result = _figures(ran, cands, judge)
    full = record(result, gate="tune-runtime", kernel=k.name, fingerprint=fp,
                  lock=lock_for(source, k.root, fp), result_path=out, verdict_path=None)
    write_atomic(log, f"{full['verdict']}: {full['message']}\n")
    return 0


def _figures(ran: dict, cands: list[Candidate], judge) -> dict:
    """Per candidate its in-runtime makespan and its ratio to its incumbent (intervals
    widened by the A/A floor), or why it has none."""
    out = {}
    for cand in cands:
        r = (ran.get("variants") or {}).get(graph_name(cand)) or {}
        h2h = r.get("head_to_head")
        row = {"cid": cand.cid, "variant": cand.variant, "config": cand.values}
        if r.get("verdict") != "pass" or not h2h:
            out[graph_name(cand)] = {**row, "verdict": r.get("verdict", ran.get("verdict", "fail")),
                                     "message": r.get("message") or ran.get("message", "no in-runtime figure")}
            continue
        judge.figures(h2h)
        (inc, x), *_ = h2h["incumbents"].items()
        c = x["vs"]["makespan"]
        if c["ratio"] is None:
            out[graph_name(cand)] = {**row, "verdict": "unsure", "message": f"no paired makespans against {inc}"}
            continue
        # as the pick compares intervals (util/stats.py median_interval's keys)
        out[graph_name(cand)] = {**row, "verdict": "timed", "incumbent": inc,
                                 "ratio": {"median": c["ratio"], "lo": c["lo"], "hi": c["hi"], "n": c["n"],
                                           "floor": c["floor"]},
                                 "time_us": h2h["ours_figures"]["makespan"],
                                 "incumbent_us": x["figures"]["makespan"]["median"]}
    timed = sum(1 for r in out.values() if r["verdict"] == "timed")
    worker = ran.get("worker") or {}
    return {"verdict": "pass" if timed else "fail", "candidates": out, "worker": worker,
            "message": f"{timed} of {len(cands)} candidates timed against their incumbent inside MPK"
                       + (f" ({ran.get('message')})" if timed < len(cands) else "")}


def ledger_rows(k, gpu_key: str) -> dict:
    """graph_name -> the runtime trial's row (none where it has not run)."""
    return (read_json(result_path(k, gpu_key)) or {}).get("candidates") or {}


def node(g, k, stage: str, trials: list[str]) -> str | None:
    """The runtime trial's node after every harness trial of k (None without mpk_root=: the
    note says the pick has no verdict-grade figure to decide by)."""
    from mpkbuild.model.graph import Node
    from mpkbuild.stages.compile import include_inputs
    from mpkbuild.stages.gates import gpu_fact
    from mpkbuild.stages.generate import template_inputs
    from mpkbuild.stages.runtime import megakernel_inputs, loads_with_tma
    from mpkbuild.stages.runtime.megakernel import runtime_fact
    from mpkbuild.util.toolchain import toolchain_fact
    request = g.runtime_request
    checkout = request.checkout if request is not None else None
    out = result_path(k, g.gpu_key)
    if checkout is None:
        g.note(stage, f"tune {k.name}: tune.figure: runtime times candidates inside MPK: without "
                      "mpk_root=PATH there is no runtime trial, and the pick fails")
        return None
    headers, include_facts = include_inputs(g, k)
    n = g.add(Node(f"trial {k.name} runtime {g.gpu_key}", "runtime_trial", stage, k.name,
                   (g.rel(out), g.rel(out.parent / "trial.log")),
                   (*trials, *(g.rel(k.section_file(s)) for s in ("codegen", "wiring", "generators",
                                                                  "validate", "tune")),
                    g.rel(k.body_source), *template_inputs(g, k, "spec_header"), *headers,
                    *megakernel_inputs(g, checkout, request.runtime, loads_with_tma(k)),
                    *(g.rel(p) for p in checkout.headers())),
                   (gpu_fact(g.fingerprint), toolchain_fact(), runtime_fact(checkout.root, request.runtime),
                    f"runtime section read: {sha256_json(trial_runtime(k.base.data))[:16]}",
                    g.code_fact("runtime_trial", (__name__, "mpkbuild.runners.runtime")), *include_facts),
                   verdict_at=0, column="trial", on_gpu=True))
    return n.targets[0]
