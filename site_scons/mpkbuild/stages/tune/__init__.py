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
    tune K <gpu>           picks per variant from every trial (util/stats.py judges
                           "faster"), writes the tuned file: the winners, every candidate
                           with its verdict and numbers (the ledger), and the key it was made from

A candidate is the spec's own configuration or one of the nearest others (fewest symbols
changed) in `tune.space` that meets the constraints and the loader's rules for a variant.
A trial times only what the pick compares (the tune's figure against the primary baseline),
and reads only what it times with, so a new threshold re-times nothing. The spec's
configuration is timed twice, first and after every other candidate of its variant, and a
candidate wins only when it is faster than both by ratio and by time (`winner`): a baseline
that moved between trials, or a first trial slowed while the clocks come up, fooled a pick
that looked at one figure once (bench/RESULTS.md §14). `tune.budget.seconds` bounds a
variant's trials; a trial past it is `not run`, never cached. A build for the GPU profile
of tuned/<profile>/<K>.json uses its values (`apply_tuned`); the file's key makes a tune
from other inputs stale on any clone. docs/gates.md (Tune) has the user's account.
"""
from __future__ import annotations

from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.util import config
from mpkbuild.util.fsutil import read_json, sha256_json
from mpkbuild.stages.tune.apply import (apply_tuned, key_changes, sections_read,  # noqa: F401
                                        tune_key, tuned_file)
from mpkbuild.stages.tune.pick import (NOT_INSIDE, clearly_faster, ledger_entry, pick, run_pick,  # noqa: F401
                                       spec_measurements, winner)
from mpkbuild.stages.tune.space import Candidate, candidate_fact, candidate_section, space  # noqa: F401
from mpkbuild.stages.tune.trials import (MIN_TRIAL_TIMEOUT_S, NOT_RUN, TRIAL, TRIAL_OUTCOMES, _candidate,  # noqa: F401
                                         budget_spent, candidate_dir, run_compile, run_trial,
                                         trial_dir, trial_files, trial_perf, trial_result)
from mpkbuild.stages.tune import runtime_trial
from mpkbuild.stages.tune.runtime_trial import run_runtime_trial


def nodes(g, k, stage: str) -> None:
    """Per candidate its compile and its trial (and the spec config's second trial), then
    the pick over them: the tune node, whose target is the committed tuned file."""
    base = k.base
    if "tune" not in base.sections:
        return
    from mpkbuild.stages.gates import waiting_node
    # trials run on this GPU profile: one whose arch the spec does not target waits
    if waiting_node(g, k, stage, "tune", (g.rel(tuned_file(g.root, g.gpu_key, k.name)),)):
        return
    run_arch = config.ARCH_FOR_CC.get(g.fingerprint.cc) if g.fingerprint else None
    arch = run_arch if run_arch in k.archs else k.archs[0]
    common = _trial_inputs(g, k)
    trials = []
    for variant, entry in space(base.data).items():
        trials += _variant_nodes(g, k, stage, arch, entry, common)
    if base.data["tune"]["figure"] == "runtime":
        trials += [t for t in [runtime_trial.node(g, k, stage, trials)] if t]
    _pick_node(g, k, stage, trials)


def _trial_inputs(g, k) -> dict:
    """What every candidate's compile and trial of k depend on besides the candidate."""
    from mpkbuild.model.paths import bandwidth_file
    from mpkbuild.stages.compile import include_inputs
    from mpkbuild.stages.gates import gpu_fact
    from mpkbuild.stages.generate import template_inputs
    from mpkbuild.util.toolchain import toolchain_fact
    base = k.base
    # a trial reads the generators and validate sections; of perf and tune what it times
    # with (a fact: the figure, the repeats, the perf settings less thresholds and other
    # baselines), so a wider space or a new threshold re-times nothing already timed
    perf = trial_perf(base.data)
    from mpkbuild.stages.tune.section import harness_figure
    settings = (f"trial: figure={harness_figure(base.data)} repeats={perf['repeats']}; "
                f"perf settings {sha256_json(perf)[:16]}")
    headers, include_facts = include_inputs(g, k)
    return {
        "trial_sources": (*(g.rel(k.section_file(s)) for s in ("generators", "validate")),
                          *(g.rel(p) for p in trial_files(k)), g.rel(bandwidth_file(g.root, g.gpu_key))),
        # a trial's result is its runner's (the pick and the ledger are the tune node's)
        "trial_facts": (gpu_fact(g.fingerprint), toolchain_fact(), settings, g.code_fact("trial", TRIAL.code())),
        "compile_sources": (g.rel(k.body_source), *template_inputs(g, k, "spec_header", "harness"), *headers),
        "compile_facts": (toolchain_fact(), g.code_fact("tunecc", ("mpkbuild.stages.tune.trials",)),
                          *include_facts),
    }


def _always_for(g, result: Path) -> str | None:
    """Why a trial runs again whatever its inputs: a crash or hang, a budget it found spent,
    or a result edited since."""
    verdict = g.previous_verdict(result)
    if verdict in ("crash", "hang"):
        return f"its last verdict was {verdict}: failures are never cached"
    if verdict == NOT_RUN:
        return "it was not run (its variant's time budget was spent): it checks the budget again"
    if verdict is not None and g.tampered(g.rel(result)):
        return f"{g.rel(result)} was modified after its trial wrote it: the trial runs again"
    return None


def _variant_nodes(g, k, stage: str, arch: str, entry: dict, common: dict) -> list[str]:
    """One variant's candidates: compile and trial each, and the spec config's trial again
    after the others (the drift check); their trial results."""
    from mpkbuild.stages.compile import include_flags, nvcc_command
    base = k.base
    timeout = max(MIN_TRIAL_TIMEOUT_S, base.data["tune"]["budget"]["seconds"] / len(entry["candidates"]))
    trials, others, current = [], [], None      # the variant's other trials; the spec config's inputs
    for cand in entry["candidates"]:
        cdir, tdir = candidate_dir(k, arch, cand), trial_dir(k, g.gpu_key, cand)
        fact = candidate_fact(base.data, cand)
        lib = cdir / f"lib{k.name}.so"
        cmd = nvcc_command(arch, g.rel(cdir / "gen" / "harness.cu"), g.rel(cdir / "gen"), g.rel(lib),
                           include_flags(k))
        cc = g.add(Node(f"tunecc {k.name} {cand.cid}", "tune_compile", stage, k.name,
                        (g.rel(cdir / "resources.json"), g.rel(lib), g.rel(cdir / "compile.log")),
                        common["compile_sources"], (common["compile_facts"][0], fact, *common["compile_facts"][1:]),
                        opts=(("MPK_CID", cand.cid), ("MPK_ARCH", arch), ("MPK_NVCC_CMD", cmd)), column="tunecc"))
        result = trial_result(k, g.gpu_key, cand)
        inputs = (cc.targets[0], *common["trial_sources"])
        f = common["trial_facts"]
        facts = (f[0], f[1], fact, *f[2:])
        node = g.add(Node(f"trial {k.name} {cand.cid} {g.gpu_key}", "trial", stage, k.name,
                          (g.rel(result), g.rel(tdir / "trial.log")), inputs, facts,
                          opts=(("MPK_CID", cand.cid), ("MPK_ARCH", arch), ("MPK_TIMEOUT", timeout)),
                          always=_always_for(g, result), verdict_at=0,
                          column="trial", on_gpu=True, outcomes=TRIAL_OUTCOMES))
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
                          always=_always_for(g, result), verdict_at=0, column="trial",
                          on_gpu=True, outcomes=TRIAL_OUTCOMES))
        trials.append(node.targets[0])
    return trials


def _pick_node(g, k, stage: str, trials: list[str]) -> None:
    """The pick over every trial: the committed tuned file, stale when it was tuned from
    other inputs than k has now."""
    from mpkbuild.stages.gates import gpu_fact
    from mpkbuild.util.toolchain import toolchain_fact
    out = tuned_file(g.root, g.gpu_key, k.name)
    always = None
    record = read_json(out)
    if record and g.fingerprint is not None:
        changes = key_changes(record.get("key") or {}, tune_key(k, g.fingerprint))
        if changes:
            always = f"{g.rel(out)} was tuned from other inputs: " + "; ".join(changes)
    node = g.add(Node(f"tune {k.name} {g.gpu_key}", "tune", stage, k.name, (g.rel(out),),
                      (*trials, g.rel(k.section_file("tune")), g.rel(k.body_source)),
                      (gpu_fact(g.fingerprint), toolchain_fact(), g.stage_code(stage)), always=always,
                      verdict_at=0, column="tune", on_gpu=True, reported=True,
                      committed=True))
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
    why = budget_spent(k, predictor.gpu_key, _candidate(k, dict(node.opts)["MPK_CID"]))
    same = why is not None and old.get("message") == why and \
        old.get("budget_s") == k.base.data["tune"]["budget"]["seconds"]
    return {} if same else None


ACTIONS = {"tune_compile": run_compile, "trial": run_trial, "tune": run_pick,
           "runtime_trial": run_runtime_trial}
