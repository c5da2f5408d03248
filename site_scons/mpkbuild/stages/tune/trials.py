"""A candidate's two nodes: its one-variant library compiled and resource-gated (CPU), and
its trial, validated and timed on a leased GPU, within its variant's time budget."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from mpkbuild.stages import table as stages
from mpkbuild.stages.table import TRIAL  # noqa: F401 (one candidate validated, then timed)
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import (dump_json, read_json, sha256_bytes, write_atomic, write_json_atomic)
from mpkbuild.stages.tune.space import Candidate, candidate_section, space
from mpkbuild.runners import facts
from mpkbuild.util import stats
from mpkbuild.util.expr import variant_facts


MIN_TRIAL_TIMEOUT_S = 20.0


NOT_RUN = "not run"          # a trial's verdict when its variant's time budget was spent
# what a trial records besides pass, none a failure: timed (perf passed), rejected (the
# candidate failed a check), not run (the budget was spent)
TRIAL_OUTCOMES = ("timed", "rejected", NOT_RUN)


# ---------------------------------------------------------------- what a trial reads
# of the perf section: not these (the gate's thresholds, its other baselines and its
# watchdog; `cold`, since a trial times the tune's `figure` whatever the gate times)
PERF_KEYS_NOT_READ = ("thresholds", "baselines", "timeout_s", "max_regression", "cold")


def trial_perf(data: dict) -> dict:
    """The perf settings a trial times with (the job's perf section, a fact of its node):
    perf's, less what a trial does not read, with the tune's repeats."""
    perf = {key: v for key, v in data["perf"].items() if key not in PERF_KEYS_NOT_READ}
    perf["repeats"] = data["tune"].get("repeats") or data["perf"]["repeats"]
    return perf


def trial_baseline_files(k) -> list[Path]:
    """The baseline files a trial loads: the primary baseline's alone (perf.baselines are
    the perf gate's, never timed by a trial: runners/perf.py `only_figure`)."""
    from mpkbuild.stages.gates import python_file
    return [python_file(k, stages.BY_NAME["perf"].gate)]


def trial_files(k) -> list[Path]:
    """Every Python file of the kernel a trial loads: validate's reference, the baseline."""
    from mpkbuild.stages.gates import python_files
    return list(dict.fromkeys([*python_files(k, TRIAL), *trial_baseline_files(k)]))


# ---------------------------------------------------------------- the stage's nodes
def candidate_dir(k, arch: str, cand: Candidate) -> Path:
    """Where a candidate's sources, library and resources are (per arch)."""
    return k.build_dir / "tune" / arch / cand.cid


def trial_dir(k, gpu_key: str, cand: Candidate) -> Path:
    """Where a candidate's trial result and log are (per GPU profile)."""
    return k.gpu_dir(gpu_key) / "tune" / cand.cid


def trial_result(k, gpu_key: str, cand: Candidate, again: bool = False) -> Path:
    """The trial's result; `again`: the spec's configuration's second trial."""
    return trial_dir(k, gpu_key, cand) / ("again" if again else "") / "trial.json"


def ledger_entry(res: dict | None, cand: Candidate, figure: str, rel: str) -> dict:
    """One candidate as the ledger keeps it: verdict, message, the figure with its interval."""
    entry = {"cid": cand.cid, "config": cand.values, "current": cand.current,
             "verdict": (res or {}).get("verdict", NOT_RUN),
             "message": (res or {}).get("message", "no trial result"), "trial": rel}
    if entry["verdict"] == NOT_RUN and "budget_s" in (res or {}):
        entry["budget_s"] = res["budget_s"]          # skipped by the budget: neither timed nor lost
    if entry["verdict"] != "timed":
        return entry
    try:
        fig = res["perf"]["variants"][cand.variant]
        # the perf gate's interval: two trials are two captures, so the ratio gets its floor
        ratios = stats.paired_ratios(fig[figure]["samples_us"], fig[f"baseline_{figure}"]["samples_us"])
        entry["ratio"] = stats.median_interval(ratios, floor=stats.CAPTURE_FLOOR)
        entry["time_us"] = stats.median_interval(fig[figure]["samples_us"])
        entry["baseline_us"] = fig[f"baseline_{figure}"]["median_us"]
    except (KeyError, TypeError, ValueError) as exc:
        entry.update(verdict="rejected", message=f"no paired {figure} samples in the trial result ({exc})")
    return entry


# ---------------------------------------------------------------- actions
def _candidate(k, cid: str) -> Candidate:
    for entry in space(k.base.data).values():
        for cand in entry["candidates"]:
            if cand.cid == cid:
                return cand
    raise KeyError(cid)


def run_compile(build, info, target, source) -> int:
    """Render and compile one candidate; a candidate nvcc or the resource gate refuses is
    recorded as rejected (an empty library beside it), and the build goes on."""
    from mpkbuild.stages.compile import CompileError, CompileJob, run_compile as nvcc
    from mpkbuild.stages.generate import TemplateError, generate_file, smem_plan
    k = build.kernels[info["MPK_KERNEL"]]
    cand = _candidate(k, info["MPK_CID"])
    section = candidate_section(k.base.data, cand)
    resources, lib, log = (Path(t.abspath) for t in target)
    gen = resources.parent / "gen"
    plan = smem_plan(section["codegen"])
    try:
        for role, name in (("spec_header", f"{k.name}_spec.h"), ("body", f"{k.name}.cuh"),
                           ("harness", "harness.cu")):
            generate_file(role, section, k.spec.file, k.body_source, k.root, gen / name)
        nvcc(CompileJob(kernel=k.name, arch=info["MPK_ARCH"], variants=(cand.variant,),
                        harness=gen / "harness.cu", library=lib, resources=resources, log=log,
                        smem_total=plan["total"], smem_budget=plan["budget"]),
             info["MPK_NVCC_CMD"], k.root)
    except (CompileError, TemplateError) as exc:
        if not log.exists():
            log.write_text(f"{exc}\n")
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"")
        write_json_atomic(resources, {"kernel": k.name, "arch": info["MPK_ARCH"], "verdict": "fail",
                                      "problems": [str(exc)], "candidate": cand.cid})
        say(f"          tunecc {k.name} {cand.cid}: rejected ({str(exc).splitlines()[-1].strip()})")
    return 0


_TURNS_GUARD = threading.Lock()


def budget_spent(k, gpu_key: str, cand: Candidate) -> str | None:
    """Why the candidate is not run (None: it runs): the trials of the candidates before it
    in its variant (the spec's own configuration first, then the nearest) recorded more
    seconds together than `tune.budget.seconds`. The spec's own configuration always runs."""
    seconds = k.base.data["tune"]["budget"]["seconds"]
    spent, counted = 0.0, 0
    for earlier in space(k.base.data)[cand.variant]["candidates"]:
        if earlier.cid == cand.cid:
            break
        took = (read_json(trial_result(k, gpu_key, earlier)) or {}).get("elapsed_s")
        if isinstance(took, (int, float)) and took > 0:
            spent, counted = spent + took, counted + 1
    if spent <= seconds:
        return None
    return (f"the variant's time budget ({seconds:g} s) was spent: {spent:.1f} s by the "
            f"{counted} trial{'s' if counted != 1 else ''} before it")


def _turn(k, gpu_key: str, variant: str) -> threading.Lock:
    """A variant's trials take turns (with -jN, variants run side by side), so each checks
    the budget after the one before it has recorded its time, not before a GPU wait."""
    with _TURNS_GUARD:
        return _TURNS.setdefault((k.name, gpu_key, variant), threading.Lock())


def run_trial(build, info, target, source) -> int:
    from mpkbuild.model.paths import bandwidth_file
    from mpkbuild.stages.tune.section import harness_figure
    from mpkbuild.run.job import GateJob
    from mpkbuild.stages.gates import GateCannotRun, lock_for, record, verdict_line
    k = build.kernels[info["MPK_KERNEL"]]
    cand = _candidate(k, info["MPK_CID"])
    again = bool(info.get("MPK_AGAIN"))       # the spec config's second trial: the budget spares it
    try:
        fp = build.ready_gpu(k.name, "tune")
    except GateCannotRun as exc:
        return build.fail(str(exc))
    out, log = Path(target[0].abspath), Path(target[1].abspath)
    cdir = candidate_dir(k, info["MPK_ARCH"], cand)
    resources = read_json(cdir / "resources.json") or {}
    if resources.get("verdict") != "pass":
        problems = resources.get("problems") or ["no resources.json"]
        result = {"verdict": "rejected", "check": "compile",
                  "message": "compile: " + " ".join(problems[0].split())[:400]}
    else:
        library = cdir / f"lib{k.name}.so"
        codegen = candidate_section(k.base.data, cand)
        payload = {"root": str(k.root), "library": str(library), "codegen": codegen,
                   facts.KEY: variant_facts(codegen["codegen"], trial_perf(k.base.data)),
                   "generators": read_json(k.section_file("generators")),
                   "validate": read_json(k.section_file("validate")),
                   "perf": {"perf": trial_perf(k.base.data)}, "figure": harness_figure(k.base.data),
                   "bandwidth_file": str(bandwidth_file(k.root, fp.key)),
                   "candidate": {"cid": cand.cid, "variant": cand.variant, "config": cand.values}}
        inputs = [library, *trial_files(k), bandwidth_file(k.root, fp.key)]
        job = GateJob("trial", k.name, payload, out.parent, float(info["MPK_TIMEOUT"]),
                      root=k.root, inputs=tuple(dict.fromkeys(os.path.relpath(p, k.root) for p in inputs)),
                      preload=stages.runner_names())
        with _turn(k, fp.key, cand.variant):
            over = None if again else budget_spent(k, fp.key, cand)
            if over is None:
                started = time.monotonic()
                try:
                    result = build.run_gate(job)
                except GateCannotRun as exc:
                    return build.fail(str(exc))
                if not isinstance(result.get("elapsed_s"), (int, float)):   # what the budget counts
                    result["elapsed_s"] = round(time.monotonic() - started - (result.get("lease_wait_s") or 0), 3)
        if over is not None:
            return _not_run(k, cand, over, target, out, log)
    result = {**result, "candidate": {"cid": cand.cid, "variant": cand.variant, "config": cand.values,
                                      "current": cand.current}}
    full = record(result, gate="trial", kernel=k.name, fingerprint=fp, lock=lock_for(source, k.root, fp),
                  result_path=out, verdict_path=None)
    if not log.exists():
        log.write_text(f"{verdict_line(full)}\n")
    say(f"          trial {k.name} {cand.variant} {cand.text()}{' (again)' if again else ''}: "
        f"{verdict_line(full)}")
    return 0


def _not_run(k, cand: Candidate, why: str, target, out: Path, log: Path) -> int:
    """A trial the budget skipped: its result says so (never timed, never lost) and is not
    a cached result: the node runs again on the next call (tune.nodes), and SCons's cache
    (cache=) never keeps it. Unchanged, the file is left as it is, so the pick is not re-run."""
    from mpkbuild.util.fsutil import written_mark
    for t in target:
        t.set_nocache()
    result = {"gate": "trial", "kernel": k.name, "verdict": NOT_RUN, "message": why,
              "budget_s": k.base.data["tune"]["budget"]["seconds"],
              "candidate": {"cid": cand.cid, "variant": cand.variant, "config": cand.values,
                            "current": cand.current}}
    old = read_json(out)
    if not (old and {key: old.get(key) for key in result} == result):
        text = dump_json(result)
        write_atomic(written_mark(out), sha256_bytes(text.encode()) + "\n")
        write_atomic(out, text)
    log.write_text(f"{NOT_RUN}: {why}\n")
    say(f"          trial {k.name} {cand.variant} {cand.text()}: {NOT_RUN}: {why}")
    return 0


_TURNS: dict = {}                # (kernel, gpu, variant) -> the lock its trials take turns with
