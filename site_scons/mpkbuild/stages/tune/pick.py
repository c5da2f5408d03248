"""The pick: a candidate replaces the spec's configuration only when its intervals (ratio
and time, util/stats.py, the perf gate's floor) lie below both of the spec's trials."""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from mpkbuild.util import config, stats
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import read_json, write_json_atomic
from mpkbuild.stages.tune import runtime_trial
from mpkbuild.stages.tune.apply import tune_key
from mpkbuild.stages.tune.section import harness_figure
from mpkbuild.stages.tune.space import Candidate, space
from mpkbuild.stages.tune.trials import NOT_RUN, ledger_entry, trial_result


INTERVAL = ("median of the paired kernel/baseline ratios, sign-test interval widened by the "
            "per-capture floor (util/stats.py), as the perf gate judges")
INTERVAL_INSIDE = ("median of the paired ours/incumbent makespan ratios inside MPK, sign-test interval "
                   "widened by the A/A floor (stages/runtime/judge.py), as the runtime gate judges")
# a candidate timed in the harness that the runtime trial did not time: never picked
NOT_INSIDE = "harness only"


# ---------------------------------------------------------------- the pick
def _simplicity(entry: dict, current: dict) -> tuple:
    levers_on = sum(1 for v in entry["config"].values() if v is True)
    changed = sum(1 for k, v in entry["config"].items() if current.get(k) != v)
    return (levers_on, changed)


def clearly_faster(a: dict, b: dict) -> bool:
    """a beats b by its interval of paired ratios to the baseline and by its interval of
    times: two trials are not paired with each other and the baseline can move between
    them (bench/RESULTS.md §14); a change both figures agree on is one drift cannot make."""
    if not stats.below(a["ratio"], b["ratio"]):
        return False
    return "time_us" not in a or "time_us" not in b or stats.below(a["time_us"], b["time_us"])


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
    k = build.kernels[info["MPK_KERNEL"]]
    try:
        fp = build.ready_gpu(k.name, "tune")
    except GateCannotRun as exc:
        return build.fail(str(exc))
    data = k.base.data
    t, cg = data["tune"], data["codegen"]
    ledger, notes = trial_ledger(k, fp.key)
    lever_names = [n for n in t["space"] if n in cg.get("levers", {})]
    wins, levers = pick(ledger, lever_names)
    variants = {variant: _winner(wins[variant], rows, cg, variant) for variant, rows in ledger.items()}
    failed = [v for v, e in variants.items() if e["config"] is None]
    out = Path(target[0].abspath)
    changed = [v for v, e in variants.items() if e.get("from") == "tune"]
    not_run = sum(n["not_run"] for n in notes.values())
    full = {
        "kernel": k.name, "gpu_profile": fp.key, "gpu": fp.to_json(), "arch": config.ARCH_FOR_CC.get(fp.cc),
        "verdict": "fail" if failed else "pass",
        "message": (f"no candidate timed for {', '.join(failed)}" if failed else
                    f"{len(changed)} of {len(variants)} variants tuned away from the spec"
                    + (f"; levers on: {', '.join(n for n, on in levers.items() if on)}"
                       if any(levers.values()) else ""))
                   + (f"; {not_run} candidate{'s' if not_run != 1 else ''} not run: "
                      f"the time budget ({t['budget']['seconds']:g} s per variant) was spent"
                      if not_run else ""),
        "figure": t["figure"], "interval": INTERVAL_INSIDE if t["figure"] == "runtime" else INTERVAL,
        **({"harness_figure": harness_figure(data)} if t["figure"] == "runtime" else {}),
        "levers": levers, "variants": variants,
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


def trial_ledger(k, gpu_key: str) -> tuple[dict, dict]:
    """Per variant every candidate's trial as a ledger row (the spec config's second trial
    beside its first; the statically rejected ones with why), and the space's notes."""
    t = k.base.data["tune"]
    figure = harness_figure(k.base.data)
    inside = runtime_trial.ledger_rows(k, gpu_key) if t["figure"] == "runtime" else None
    ledger, notes = {}, {}
    for variant, entry in space(k.base.data).items():
        rows = []
        for cand in entry["candidates"]:
            path = trial_result(k, gpu_key, cand)
            row = ledger_entry(read_json(path), cand, figure, os.path.relpath(path, k.root))
            again = trial_result(k, gpu_key, cand, again=True)
            if cand.current and again.exists():
                row["again"] = ledger_entry(read_json(again), cand, figure, os.path.relpath(again, k.root))
            if inside is not None:
                row = _decided_inside_mpk(row, inside.get(runtime_trial.graph_name(cand)), bool(inside))
            rows.append(row)
        for values, why in entry["static_rejected"]:
            rows.append({"cid": None, "config": values, "current": False, "verdict": "rejected",
                         "message": f"not a valid variant: {why}"})
        ledger[variant] = rows
        notes[variant] = {"excluded_by_constraints": entry["excluded_by_constraints"],
                          "over_budget": entry["over_budget"],
                          "not_run": sum(1 for r in rows if "budget_s" in r),
                          "budget_s": t["budget"]["seconds"]}
    return ledger, notes


def _decided_inside_mpk(row: dict, inside: dict | None, trial_ran: bool = True) -> dict:
    """A ledger row of `tune.figure: runtime`: its ratio and time the runtime trial's (ours /
    the incumbent's makespan inside MPK; one measurement, the A/A floor in its interval),
    the harness's kept beside them; a candidate the runtime trial did not time is not
    picked, and says why."""
    harness = {key: row.pop(key) for key in ("ratio", "time_us", "baseline_us", "again") if key in row}
    row["harness"] = {"verdict": row["verdict"], **harness}
    if inside is not None and inside.get("verdict") == "timed":
        row.update(verdict="timed", ratio=inside["ratio"], time_us=inside["time_us"],
                   incumbent=inside["incumbent"], message=f"inside MPK: {inside['ratio']['median']:.3f}x "
                   f"{inside['incumbent']}'s makespan ({inside['time_us']['median']:.2f} us)")
    elif row["verdict"] == "timed":
        row.update(verdict=NOT_INSIDE, message=(inside or {}).get("message") or (
            f"not timed inside MPK: neither among the harness's {runtime_trial.RUNTIME_CANDIDATES} "
            "fastest nor the harness's fastest of its task count" if trial_ran else
            "no runtime trial has run (tune.figure: runtime times candidates inside MPK: give mpk_root=)"))
    return row


def _winner(w: dict | None, rows: list[dict], cg: dict, variant: str) -> dict:
    """A variant's entry of the tuned file: its winner (rows get their ratio to it), or
    that no candidate was timed."""
    spec_row = next(r for r in rows if r["current"])
    for r in rows:
        if "ratio" in r and w is not None:
            r["vs_winner"] = round(r["ratio"]["median"] / w["ratio"]["median"], 4)
    if w is None:
        return {"config": None, "message": "no candidate was timed"}
    symbols = {s: v for s, v in w["config"].items() if s not in cg.get("levers", {})}
    return {
        "config": symbols, "spec": {s: cg["variants"][variant][s] for s in symbols},
        "cid": w["cid"], "from": "spec" if w["current"] else "tune",
        "time_us": w["time_us"], "ratio": w["ratio"],
        # a change against the spec's faster trial: what it gains at the least
        "vs_spec": (1.0 if w["current"] else
                    round(w["ratio"]["median"] / min(r["ratio"]["median"]
                                                     for r in spec_measurements(spec_row)), 4)
                    if "ratio" in spec_row else None)}
