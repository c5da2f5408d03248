"""The tune stage: each kernel's configuration space searched, validated, timed and cached
per GPU profile; the winners committed as tuned/<gpu-profile>/<kernel>.json.

Nodes, per kernel with a `tune` section and GPU profile (all in the one graph, so SCons
decides what runs and -jN spreads them):

    tunecc K <cid>         one per candidate: the candidate's one-variant sources rendered
                           and compiled for the profile's arch, resource-gated; a candidate
                           that spills or exceeds SMEM (or does not compile) is recorded as
                           rejected (resources.json, verdict fail), never timed
    trial K <cid> <gpu>    one per candidate: validate, and time the survivors, through the
                           executor (a GPU lease per trial; a variant's trials take turns, so
                           -jN with gpus=0,1 runs two variants' at once)
    tune K <gpu>           picks per variant from every trial (stages/interval.py judges
                           "faster"), writes the tuned file: the winners, every candidate
                           with its verdict and numbers (the ledger), and the key it was made from

A candidate is a variant with some of its symbols (and levers) set to values of
`tune.space`: the spec's own configuration first, then the nearest others (fewest symbols
changed) that meet `tune.constraints` and the loader's rules for a variant (tiling, grid,
partitions, the SMEM plan), up to `tune.budget.candidates`. Candidates are derived from the
spec's codegen, never from a tuned one, so a tune never makes itself stale. A trial is its
own node with its own inputs: a candidate that lost is not timed again unless one of them
changed (a crashed or hung trial is, as any failed gate).

What a trial times is what the pick compares (ledger_entry): the tune's `figure` (hot or
cold) of the candidate, paired with the primary baseline (`perf.baseline`), and nothing
else: no other baseline of perf.baselines (a torch.compile one would be compiled in every
trial), no other figure, no slowCTA (runners/perf.py `only_figure`). Its inputs are what it
reads: the library, the generators and validate sections, the reference and the primary
baseline's file (trial_files; the key hashes the same baseline files), the bandwidth node,
and as a fact the figure, the repeats and the perf settings less the gate's thresholds,
other baselines and watchdog (trial_perf): a new threshold or extra baseline re-times nothing.

The spec's configuration is timed twice: first, and again after every other candidate of
its variant (`trial K <cid> again <gpu>`, whose sources are the other trials' results, so
SCons runs it last, and again when any of them is re-timed). A disturbance only ever slows
a trial, and the first trial of a variant is the one most exposed (the GPU's clocks
ramping up from idle): on an H200 (2026-12-01) two of silu_mul_v2's ten variants had the
spec's config 10-16% slower in its one trial than in another run of the same tune, and
tune took configs that were no faster as 10-14% faster. A candidate wins only when it is
clearly faster than both of the spec's measurements (`winner`).

The time budget: `tune.budget.seconds` per variant. A trial about to run adds up the seconds
recorded by the trials of the candidates before it in its variant (their order: the spec's
own configuration, which therefore always runs, then the nearest); past the budget it does
not run and its result says `not run: the variant's time budget (N s) was spent`, never
timed, never lost. That is not a cached result: the node runs again on every call, and a
larger budget (or earlier trials that now record less) runs it; while nothing changed it
leaves its file as it is, so the pick does not re-run. With -j1 SCons runs the trials in
the candidates' order; with -jN a variant's trials take turns (one lock per variant, taken
in about the order they became ready), so each checks the budget when its turn comes, not
before a wait for a GPU; a trial still counts only the candidates before it. The budget
also sets each trial's watchdog: budget / candidates, at least MIN_TRIAL_TIMEOUT_S.

Using the result: when tuned/<profile>/<K>.json exists for the GPU profile the build is for
(`gpu=` or the detected GPU), `apply_tuned` sets the tuned variants' symbols (and levers)
in the codegen section the whole build uses; for every other profile the spec's values
stay. The spec node carries the file's hash as a fact, so status says "tuned config" when
it is what changed. The file's key (body, the sections the stage reads -- of perf what the
trials read --, the reference and the baseline files the trials read, toolchain, GPU
signature, the search space) is compared with the current one on every plan: a mismatch
makes the tune node stale with the reasons, on any clone.
"""
from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.util import config, expr
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import (dump_json, read_json, sha256_bytes, sha256_file, sha256_json,
                                  sha256_or_missing, write_atomic, write_json_atomic)

TUNED_DIRNAME = "tuned"
MIN_TRIAL_TIMEOUT_S = 20.0
NOT_RUN = "not run"          # a trial's verdict when its variant's time budget was spent
SECTIONS_READ = ("tune", "generators", "validate", "perf")   # "tune" holds the spec's codegen


def tuned_file(root: Path | str, gpu_key: str, kernel: str) -> Path:
    return Path(root) / TUNED_DIRNAME / gpu_key / f"{kernel}.json"


# ---------------------------------------------------------------- the search space
@dataclass(frozen=True)
class Candidate:
    variant: str
    config: tuple[tuple[str, object], ...]     # space name -> value, in the space's order
    current: bool                              # the spec's own configuration

    @property
    def values(self) -> dict:
        return dict(self.config)

    @property
    def cid(self) -> str:
        digest = hashlib.sha256(json.dumps([self.variant, self.config]).encode()).hexdigest()[:10]
        return f"{self.variant}-{digest}"

    def text(self) -> str:
        return " ".join(f"{k}={_fmt(v)}" for k, v in self.config)


def _fmt(v) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def _consts(cg: dict) -> dict:
    return {"threads": cg["threads"], **{k: v for k, v in cg["params"].items() if not isinstance(v, bool)}}


def _split(cg: dict, values: dict) -> tuple[dict, dict]:
    levers = cg.get("levers", {})
    return ({k: v for k, v in values.items() if k not in levers},
            {k: v for k, v in values.items() if k in levers})


def candidate_problem(data: dict, variant: str, values: dict, constraints: bool = True) -> str | None:
    """Why a configuration of one variant is not a candidate (None: it is one): a
    constraint it breaks, or a rule of the loader's it breaks for that variant."""
    from mpkbuild.model.spec import SmemPlanError, smem_layout, variant_tensors
    cg = data["codegen"]
    symbols_set, lever_set = _split(cg, values)
    binding = {**cg["variants"][variant], **symbols_set}
    levers = {k: bool(v.get("default", False)) for k, v in cg.get("levers", {}).items()}
    levers.update(lever_set)
    symbols = {**_consts(cg), **binding}
    try:
        if constraints:
            for text in data["tune"]["constraints"]:
                if not expr.holds(text, {**symbols, **{k: int(v) for k, v in levers.items()}}):
                    return f"constraint {text!r}"
        for rule in cg["tiling"]:
            mult = expr.evaluate(rule["multiple_of"], symbols, cpp_int=True)
            if not isinstance(mult, int) or mult <= 0 or binding[rule["symbol"]] % mult:
                return f"tiling: {rule['symbol']} not a multiple of {rule['multiple_of']}"
        blocks = expr.evaluate(cg["min_blocks_per_sm"], symbols)
        if not isinstance(blocks, int) or not 1 <= blocks <= 32:
            return f"min_blocks_per_sm = {blocks!r}"
        grid = expr.evaluate(cg["grid"][0], symbols)
        if not isinstance(grid, int) or not 1 <= grid <= config.INT32_MAX:
            return f"grid = {grid!r}"
        for kind, tensors in variant_tensors(cg, variant).items():
            for t in tensors:
                for d, extent in enumerate(t["shape"]):
                    n = expr.evaluate(extent, symbols)
                    if not isinstance(n, int) or not 1 <= n <= config.INT32_MAX:
                        return f"{t['name']} extent {extent} = {n!r}"
                    if t["partition"][d] == 0 and n % grid:
                        return f"{t['name']} dim {d} ({n}) is not split evenly over {grid} tasks"
        smem_layout(cg["smem"], symbols)
    except SmemPlanError as exc:
        return f"SMEM plan: {exc}"
    except (expr.ExprError, KeyError) as exc:
        return f"does not evaluate: {exc}"
    return None


_SPACES: dict = {}


def space(data: dict) -> dict:
    """The candidates (computed once per tune section and codegen in a process)."""
    key = sha256_json({"tune": data["tune"], "codegen": data["codegen"]})
    if key not in _SPACES:
        _SPACES[key] = _space(data)
    return _SPACES[key]


def _space(data: dict) -> dict:
    """{variant: {"candidates": [Candidate], "excluded": {reason kind: count},
    "static_rejected": [(values, why)]}} for the tuned variants."""
    from mpkbuild.model.spec import tuned_variants
    t, cg = data["tune"], data["codegen"]
    levers = cg.get("levers", {})
    names = list(t["space"])
    out = {}
    for variant in tuned_variants(data):
        binding = cg["variants"][variant]
        current = {n: bool(levers[n]["default"]) if n in levers else binding[n] for n in names}
        valid, excluded, rejected = [], 0, []
        for i, combo in enumerate(itertools.product(*t["space"].values())):
            values = dict(zip(names, combo))
            if values == current:
                continue
            why = candidate_problem(data, variant, values)
            if why is None:
                valid.append((sum(values[n] != current[n] for n in names), i, values))
            elif why.startswith("constraint"):
                excluded += 1
            else:
                rejected.append((values, why))
        valid.sort(key=lambda item: item[:2])
        budget = t["budget"]["candidates"]
        chosen = [current] + [v for _, _, v in valid[:budget - 1]]
        out[variant] = {
            "candidates": [Candidate(variant, tuple((n, c[n]) for n in names), c is current) for c in chosen],
            "excluded_by_constraints": excluded, "over_budget": max(0, len(valid) - (budget - 1)),
            "static_rejected": rejected}
    return out


def candidate_section(data: dict, cand: Candidate) -> dict:
    """The codegen section of a candidate's own build: one variant, its configuration."""
    cg = copy.deepcopy(data["codegen"])
    symbols_set, lever_set = _split(cg, cand.values)
    cg["variants"] = {cand.variant: {**cg["variants"][cand.variant], **symbols_set}}
    for name, value in lever_set.items():
        cg["levers"][name]["default"] = bool(value)
    return json.loads(dump_json({"kernel": data["kernel"], "op": data["op"], "family": data["family"],
                                 "codegen": cg}))


def candidate_fact(data: dict, cand: Candidate) -> str:
    return f"candidate: {cand.variant} {cand.text()}; codegen {sha256_json(candidate_section(data, cand))[:16]}"


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
    from mpkbuild.stages.gates import GATES, python_file
    return [python_file(k, GATES["perf"])]


def trial_files(k) -> list[Path]:
    """Every Python file of the kernel a trial loads: validate's reference, the baseline."""
    from mpkbuild.stages.gates import GATES, python_files
    return list(dict.fromkeys([*python_files(k, GATES["trial"]), *trial_baseline_files(k)]))


# ---------------------------------------------------------------- the key
def tune_key(k, fingerprint) -> dict:
    """What a tune was made from: any change makes it stale (and says which)."""
    from mpkbuild.stages.compile import toolchain_fact
    from mpkbuild.stages.gates import GATES, python_file
    base = k.base
    sp = space(base.data)
    sections = {s: base.signatures[s] for s in SECTIONS_READ}
    sections["perf"] = sha256_json(trial_perf(base.data))     # what the trials read of it
    return {
        "body": sha256_or_missing(k.body_source),
        "sections": sections,
        "reference": sha256_or_missing(python_file(k, GATES["validate"])),
        # every baseline file the trials read (the same list as their inputs)
        "baseline": {os.path.relpath(p, k.root): sha256_or_missing(p) for p in trial_baseline_files(k)},
        "toolchain": toolchain_fact(),
        "gpu": fingerprint.signature() if fingerprint else "none",
        "space": sha256_json({v: [c.cid for c in s["candidates"]] for v, s in sp.items()})[:16],
        "candidates": sum(len(s["candidates"]) for s in sp.values()),
    }


KEY_WORDS = {"body": "the body source changed", "reference": "the reference changed",
             "baseline": "the torch baseline changed"}


def key_changes(old: dict, new: dict) -> list[str]:
    out = []
    for field in ("body", "reference", "baseline"):
        if old.get(field) != new.get(field):
            was, now = old.get(field), new.get(field)
            files = sorted(f for f in set(was or {}) | set(now) if (was or {}).get(f) != now.get(f)) \
                if isinstance(now, dict) and isinstance(was, dict) else []
            out.append(KEY_WORDS[field] + (f" ({', '.join(files)})" if files else ""))
    for s, sig in new["sections"].items():
        if (old.get("sections") or {}).get(s) != sig:
            out.append(f"spec section {s if s != 'tune' else 'tune (or the codegen it tunes)'} changed")
    if old.get("toolchain") != new["toolchain"]:
        out.append(f"toolchain {str(old.get('toolchain')).split(';')[0]} -> {new['toolchain'].split(';')[0]}")
    if old.get("gpu") != new["gpu"]:
        out.append(f"GPU {old.get('gpu')} -> {new['gpu']}")
    if old.get("space") != new["space"]:
        out.append(f"search space changed ({old.get('candidates')} -> {new['candidates']} candidates)")
    return out


# ---------------------------------------------------------------- using a tuned file
def apply_tuned(k, fingerprint):
    """The kernel as the build for this GPU profile sees it: the spec's codegen with the
    tuned file's values, or the kernel unchanged (no profile, no file, no tune section).
    A variant whose tuned values no longer make a valid variant keeps the spec's."""
    if fingerprint is None or "tune" not in k.base.sections:
        return k
    path = tuned_file(k.root, fingerprint.key, k.name)
    record = read_json(path)
    if not record or not isinstance(record.get("variants"), dict):
        return k
    data = copy.deepcopy(k.base.data)
    cg = data["codegen"]
    applied, skipped = [], {}
    levers = {n: bool(v) for n, v in (record.get("levers") or {}).items() if n in cg.get("levers", {})}
    for name, value in levers.items():
        cg["levers"][name]["default"] = value
    for variant, entry in record["variants"].items():
        if variant not in cg["variants"]:
            skipped[variant] = "no such variant in the spec"
            continue
        values = {s: v for s, v in (entry.get("config") or {}).items() if s in cg["variants"][variant]}
        why = candidate_problem(data, variant, values, constraints=False)
        if why:
            skipped[variant] = why
            continue
        if any(cg["variants"][variant][s] != v for s, v in values.items()):
            cg["variants"][variant] = {**cg["variants"][variant], **values}
            applied.append(variant)
    rel = os.path.relpath(path, k.root)
    tuned = {"path": rel, "sha256": sha256_file(path), "applied": applied, "skipped": skipped,
             "levers": levers}
    if not applied and not any(levers.values()):
        return replace(k, tuned=tuned)
    from mpkbuild.model.spec import SECTIONS
    data = json.loads(dump_json(data))
    sections = dict(k.base.sections)
    sections["codegen"] = {key: data[key] for key in SECTIONS["codegen"]}
    signatures = {**k.base.signatures, "codegen": sha256_json(sections["codegen"])}
    spec = replace(k.base, data=data, sections=sections, signatures=signatures)
    return replace(k, spec=spec, base_spec=k.base, tuned=tuned)


def tuned_fact(k) -> tuple[str, ...]:
    """The spec node's (and review's) fact for the tuned file it used, if any."""
    if not k.tuned:
        return ()
    return (f"tuned: {k.tuned['path']} sha256 {k.tuned['sha256'][:12]}",)


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


def nodes(g, k, stage: str) -> None:
    from mpkbuild.model.kernel import bandwidth_file
    from mpkbuild.stages.compile import nvcc_command, toolchain_fact
    from mpkbuild.stages.gates import GATES, gpu_fact
    base = k.base
    if "tune" not in base.sections:
        return
    run_arch = config.ARCH_FOR_CC.get(g.fingerprint.cc) if g.fingerprint else None
    arch = run_arch if run_arch in k.archs else k.archs[0]
    sp = space(base.data)
    kind = GATES["trial"]
    trial_code = [g.rel(p) for p in kind.code()]
    refs = [g.rel(p) for p in trial_files(k)]
    # a trial reads the generators and validate sections; of perf and tune what it times
    # with (a fact: the figure, the repeats, the perf settings less thresholds and other
    # baselines), so a wider space or a new threshold re-times nothing already timed
    sections = [g.rel(k.section_file(s)) for s in ("generators", "validate")]
    perf = trial_perf(base.data)
    settings = (f"trial: figure={base.data['tune']['figure']} repeats={perf['repeats']}; "
                f"perf settings {sha256_json(perf)[:16]}")
    compile_sources = (g.rel(k.body_source), g.pkg("templates", "spec_header.h.j2"),
                       g.pkg("templates", "harness.cu.j2"), g.pkg("stages", "generate.py"),
                       g.pkg("stages", "compile.py"), g.pkg("stages", "tune.py"))
    trials = []

    def always_for(result: Path) -> str | None:
        verdict = g.previous_verdict(result)
        if verdict in ("crash", "hang"):
            return f"its last verdict was {verdict}: failures are never cached"
        if verdict == NOT_RUN:
            return "it was not run (its variant's time budget was spent): it checks the budget again"
        if verdict is not None and g.tampered(g.rel(result)):
            return f"{g.rel(result)} was modified after its trial wrote it: the trial runs again"
        return None

    for variant, entry in sp.items():
        timeout = max(MIN_TRIAL_TIMEOUT_S, base.data["tune"]["budget"]["seconds"] / len(entry["candidates"]))
        others, current = [], None       # the variant's other trials; the spec config's inputs
        for cand in entry["candidates"]:
            cdir, tdir = candidate_dir(k, arch, cand), trial_dir(k, g.gpu_key, cand)
            fact = candidate_fact(base.data, cand)
            lib = cdir / f"lib{k.name}.so"
            cmd = nvcc_command(arch, g.rel(cdir / "gen" / "harness.cu"), g.rel(cdir / "gen"), g.rel(lib))
            cc = g.add(Node(f"tunecc {k.name} {cand.cid}", "tune_compile", stage, k.name,
                            (g.rel(cdir / "resources.json"), g.rel(lib), g.rel(cdir / "compile.log")),
                            compile_sources, (toolchain_fact(), fact),
                            opts=(("MPK_CID", cand.cid), ("MPK_ARCH", arch), ("MPK_NVCC_CMD", cmd))))
            result = trial_result(k, g.gpu_key, cand)
            inputs = (cc.targets[0], *sections, *trial_code, *refs, g.rel(bandwidth_file(g.root, g.gpu_key)))
            facts = (gpu_fact(g.fingerprint), toolchain_fact(), fact, settings)
            node = g.add(Node(f"trial {k.name} {cand.cid} {g.gpu_key}", "trial", stage, k.name,
                              (g.rel(result), g.rel(tdir / "trial.log")), inputs, facts,
                              opts=(("MPK_CID", cand.cid), ("MPK_ARCH", arch),
                                    ("MPK_TIMEOUT", timeout)), always=always_for(result)))
            trials.append(node.targets[0])
            if cand.current:
                current = (cand, inputs, facts)
            else:
                others.append(node.targets[0])
        if current is not None and others:
            cand, inputs, facts = current
            result = trial_result(k, g.gpu_key, cand, again=True)
            node = g.add(Node(f"trial {k.name} {cand.cid} again {g.gpu_key}", "trial", stage, k.name,
                              (g.rel(result), g.rel(result.parent / "trial.log")),
                              (*inputs, *others), facts,
                              opts=(("MPK_CID", cand.cid), ("MPK_ARCH", arch),
                                    ("MPK_TIMEOUT", timeout), ("MPK_AGAIN", 1)),
                              always=always_for(result)))
            trials.append(node.targets[0])
    out = tuned_file(g.root, g.gpu_key, k.name)
    always = None
    record = read_json(out)
    if record and g.fingerprint is not None:
        changes = key_changes(record.get("key") or {}, tune_key(k, g.fingerprint))
        if changes:
            always = f"{g.rel(out)} was tuned from other inputs: " + "; ".join(changes)
    node = g.add(Node(f"tune {k.name} {g.gpu_key}", "tune", stage, k.name, (g.rel(out),),
                      (*trials, g.rel(k.section_file("tune")), g.rel(k.body_source),
                       g.pkg("stages", "tune.py"), g.pkg("stages", "interval.py")),
                      (gpu_fact(g.fingerprint), toolchain_fact()), always=always))
    g.requested[(k.name, stage)] = list(node.targets)


def predict(node, k, predictor) -> dict | None:
    """nvcc, the GPU and the pick cannot be known without running them; a trial the budget
    skipped can: with the budget and the earlier trials' recorded times as they are, it
    leaves its result as it is (were an earlier trial to run, the pick is stale from it)."""
    if node.kind != "trial" or k is None:
        return None
    old = read_json(predictor.root / node.targets[0])
    if not old or old.get("verdict") != NOT_RUN:
        return None
    gpu_key = node.label.rsplit(" ", 1)[1]
    why = budget_spent(k, gpu_key, _candidate(k, dict(node.opts)["MPK_CID"]))
    same = why is not None and old.get("message") == why and \
        old.get("budget_s") == k.base.data["tune"]["budget"]["seconds"]
    return {} if same else None


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


_TURNS: dict = {}                # (kernel, gpu, variant) -> the lock its trials take turns with
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
    from mpkbuild.model.kernel import bandwidth_file
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
        payload = {"root": str(k.root), "library": str(library),
                   "codegen": candidate_section(k.base.data, cand),
                   "generators": read_json(k.section_file("generators")),
                   "validate": read_json(k.section_file("validate")),
                   "perf": {"perf": trial_perf(k.base.data)}, "figure": k.base.data["tune"]["figure"],
                   "bandwidth_file": str(bandwidth_file(k.root, fp.key)),
                   "candidate": {"cid": cand.cid, "variant": cand.variant, "config": cand.values}}
        inputs = [library, *trial_files(k), bandwidth_file(k.root, fp.key)]
        job = GateJob("trial", k.name, payload, out.parent, float(info["MPK_TIMEOUT"]),
                      root=k.root, inputs=tuple(dict.fromkeys(os.path.relpath(p, k.root) for p in inputs)))
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
    from mpkbuild.stages.gates import written_mark
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


# ---------------------------------------------------------------- the pick
def ledger_entry(res: dict | None, cand: Candidate, figure: str, rel: str) -> dict:
    """One candidate as the ledger keeps it: verdict, message, the figure with its interval."""
    from mpkbuild.stages import interval
    entry = {"cid": cand.cid, "config": cand.values, "current": cand.current,
             "verdict": (res or {}).get("verdict", NOT_RUN),
             "message": (res or {}).get("message", "no trial result"), "trial": rel}
    if entry["verdict"] == NOT_RUN and "budget_s" in (res or {}):
        entry["budget_s"] = res["budget_s"]          # skipped by the budget: neither timed nor lost
    if entry["verdict"] != "timed":
        return entry
    try:
        fig = res["perf"]["variants"][cand.variant]
        ratios = interval.paired_ratios(fig[figure], fig[f"baseline_{figure}"])
        entry["ratio"] = interval.median_interval(ratios)
        entry["time_us"] = interval.median_interval(fig[figure]["samples_us"])
        entry["baseline_us"] = fig[f"baseline_{figure}"]["median_us"]
    except (KeyError, TypeError, ValueError) as exc:
        entry.update(verdict="rejected", message=f"no paired {figure} samples in the trial result ({exc})")
    return entry


def _simplicity(entry: dict, current: dict) -> tuple:
    levers_on = sum(1 for v in entry["config"].values() if v is True)
    changed = sum(1 for k, v in entry["config"].items() if current.get(k) != v)
    return (levers_on, changed)


def clearly_faster(a: dict, b: dict) -> bool:
    """a beats b by its interval of paired ratios to the baseline and by its interval of
    times. Each trial is paired with the baseline within itself, but two trials are not
    paired with each other, and the baseline can move between them: on an H200
    (2026-12-01) torch's linear took 32.4 µs in one linear_v2 trial and 30.2-30.3 µs in the
    15 others of its variant, so by the ratio alone tune picked a config 2.3% slower in time
    as 4.5% faster. A change that both figures agree on is one drift cannot make."""
    from mpkbuild.stages import interval
    if not interval.faster(a["ratio"], b["ratio"]):
        return False
    return "time_us" not in a or "time_us" not in b or interval.faster(a["time_us"], b["time_us"])


def spec_measurements(row: dict) -> list[dict]:
    """The spec's configuration's timed trials: the first and, if timed, the one after
    every other candidate."""
    again = row.get("again") or {}
    return [row] + ([again] if again.get("verdict") == "timed" else [])


def winner(entries: list[dict]) -> dict | None:
    """The fastest candidate that is clearly faster than the spec's configuration (by ratio
    and by time, than each of its two trials: `again`); among those that cannot be told
    apart from it, the simplest (fewest levers on, fewest symbols changed); with nothing
    clearly faster, the spec's configuration."""
    timed = [e for e in entries if e["verdict"] == "timed"]
    if not timed:
        return None
    current = next((e for e in timed if e["current"]), None)
    spec_cfg = next((e["config"] for e in entries if e["current"]), {})
    ref = current or min(timed, key=lambda e: (_simplicity(e, spec_cfg), e["ratio"]["median"]))
    refs = spec_measurements(ref)
    better = [e for e in timed if all(clearly_faster(e, r) for r in refs)]
    if not better:
        return ref
    best = min(better, key=lambda e: e["ratio"]["median"])
    close = [e for e in better if not clearly_faster(best, e)]
    return min(close, key=lambda e: (_simplicity(e, spec_cfg), e["ratio"]["median"]))


def pick(ledger: dict[str, list[dict]], lever_names: list[str]) -> tuple[dict, dict]:
    """({variant: winning entry or None}, {lever: on}). A lever is kernel-wide (one body
    render serves every variant): it is on only if, with it free, every tuned variant's
    winner has it on; the winners are then picked among candidates with the levers so set."""
    fixed: dict = {}

    def among(entries):
        return [e for e in entries if all(e["config"].get(n, v) == v for n, v in fixed.items())]

    for name in lever_names:
        wins = [winner(among(entries)) for entries in ledger.values()]
        wins = [w for w in wins if w is not None]
        fixed[name] = bool(wins) and all(w["config"].get(name) is True for w in wins)
    return {v: winner(among(entries)) for v, entries in ledger.items()}, fixed


def run_pick(build, info, target, source) -> int:
    from mpkbuild.stages.gates import GateCannotRun, lock_for
    from mpkbuild.stages import interval
    k = build.kernels[info["MPK_KERNEL"]]
    try:
        fp = build.ready_gpu(k.name, "tune")
    except GateCannotRun as exc:
        return build.fail(str(exc))
    data = k.base.data
    t, cg = data["tune"], data["codegen"]
    figure = t["figure"]
    sp = space(data)
    arch = config.ARCH_FOR_CC.get(fp.cc)
    ledger, notes = {}, {}
    for variant, entry in sp.items():
        rows = []
        for cand in entry["candidates"]:
            path = trial_result(k, fp.key, cand)
            row = ledger_entry(read_json(path), cand, figure, os.path.relpath(path, k.root))
            again = trial_result(k, fp.key, cand, again=True)
            if cand.current and again.exists():
                row["again"] = ledger_entry(read_json(again), cand, figure, os.path.relpath(again, k.root))
            rows.append(row)
        for values, why in entry["static_rejected"]:
            rows.append({"cid": None, "config": values, "current": False, "verdict": "rejected",
                         "message": f"not a valid variant: {why}"})
        ledger[variant] = rows
        notes[variant] = {"excluded_by_constraints": entry["excluded_by_constraints"],
                          "over_budget": entry["over_budget"],
                          "not_run": sum(1 for r in rows if "budget_s" in r),
                          "budget_s": t["budget"]["seconds"]}
    lever_names = [n for n in t["space"] if n in cg.get("levers", {})]
    wins, levers = pick(ledger, lever_names)
    variants, failed = {}, []
    for variant, rows in ledger.items():
        w = wins[variant]
        spec_row = next(r for r in rows if r["current"])
        for r in rows:
            if "ratio" in r and w is not None:
                r["vs_winner"] = round(r["ratio"]["median"] / w["ratio"]["median"], 4)
        if w is None:
            failed.append(variant)
            variants[variant] = {"config": None, "message": "no candidate was timed"}
            continue
        symbols = {s: v for s, v in w["config"].items() if s not in cg.get("levers", {})}
        variants[variant] = {
            "config": symbols, "spec": {s: cg["variants"][variant][s] for s in symbols},
            "cid": w["cid"], "from": "spec" if w["current"] else "tune",
            "time_us": w["time_us"], "ratio": w["ratio"],
            # a change against the spec's faster trial: what it gains at the least
            "vs_spec": (1.0 if w["current"] else
                        round(w["ratio"]["median"] / min(r["ratio"]["median"]
                                                         for r in spec_measurements(spec_row)), 4)
                        if "ratio" in spec_row else None)}
    out = Path(target[0].abspath)
    changed = [v for v, e in variants.items() if e.get("from") == "tune"]
    not_run = sum(n["not_run"] for n in notes.values())
    full = {
        "kernel": k.name, "gpu_profile": fp.key, "gpu": fp.to_json(), "arch": arch,
        "verdict": "fail" if failed else "pass",
        "message": (f"no candidate timed for {', '.join(failed)}" if failed else
                    f"{len(changed)} of {len(variants)} variants tuned away from the spec"
                    + (f"; levers on: {', '.join(n for n, on in levers.items() if on)}"
                       if any(levers.values()) else ""))
                   + (f"; {not_run} candidate{'s' if not_run != 1 else ''} not run: "
                      f"the time budget ({t['budget']['seconds']:g} s per variant) was spent"
                      if not_run else ""),
        "figure": figure, "interval": interval.METHOD, "levers": levers, "variants": variants,
        "ledger": ledger, "space": notes, "key": tune_key(k, fp),
        "inputs": lock_for(source, k.root, fp),
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(out, full)
    for variant, e in variants.items():
        if e.get("config") is None:
            say(f"          tune {k.name} {variant}: no candidate timed")
            continue
        cfg = " ".join(f"{s}={v}" for s, v in e["config"].items())
        tu = e["time_us"]
        say(f"          tune {k.name} {variant}: {cfg} ({e['from']}) {tu['median']:.2f} us "
              f"[{tu['lo']:.2f}, {tu['hi']:.2f}]" + (f", {e['vs_spec']:.3f}x the spec's" if e["vs_spec"] else ""))
    say(f"          tune {k.name}: {full['message']} -> {os.path.relpath(out, k.root)}")
    return 0


ACTIONS = {"tune_compile": run_compile, "trial": run_trial, "tune": run_pick}
