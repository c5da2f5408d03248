"""The runtime gate's verdict on its in-runtime figures, made on the build side.

The runner checks numerics (the reference, every iteration; the incumbent's output on the
same inputs) and times ours and each incumbent launched in turn inside the persistent
kernel. Here each figure gets its interval and each comparison its verdict, the way the
perf judge does it: the makespan (the op's first task start to its last task end) and the
slowCTA (its slowest task) as the interval of the median over the launches; ours /
incumbent as the interval of the median of the paired ratios (launch p of ours with launch
p of the incumbent), faster / slower / same / unsure. A `runtime.thresholds` rule passes
when the whole interval is within `max_vs_incumbent`, fails when the whole of it is over,
is unsure otherwise; a rule with nothing to judge (the incumbent cannot run on this
checkout) fails and says why; a rule naming an incumbent of the other runtime (v1 or
Runtime-V2) is not this run's to judge. Every sample is one launch (on Runtime-V2 the median
of its iterations; with `runtime.memory: cold` a launch after the L2 was filled with other,
clean data, the hot launches beside them a diagnostic, judged alike but held to no rule), timed
by the runtime's own profiler (on v2 the megakernel's marks). The
floor is the gate's own: ours against ours set up separately in the same megakernel (the A/A
side), whose ratio should be 1; how far its interval reaches from 1 widens every ratio's
interval each side, as perf's capture floor does, so "faster" and "slower" are said only
beyond what the gate cannot tell apart from itself. Where the worker is production-shaped,
ours is also timed in its variant's worker alone (the same source without the model's other
tasks and the other variants; the key "minimal"): ours / that, widened alike, is the
composition's effect on ours, shown, held to no rule.
Standard library only.
"""
from __future__ import annotations

from mpkbuild.util import stats
from mpkbuild.wire.incumbents import TABLE as INCUMBENTS, matching

FIGURES = ("makespan", "slowcta")
# shown, never judged (a record made before 2026-12-06 has neither): the start spread, first
# task start to last task start (the makespan's part spent getting every task going), and the
# dispatch, the graph's begin task's end (which fires the op's event) to the first task start
# (left out of the makespan; v1 only)
SHOWN = ("startspread", "dispatch")


def figures(h2h: dict) -> None:
    """Intervals and comparisons into the head to head record, in place: the A/A floor of
    each figure (0 where the record has no A/A side), then every ratio widened by it."""
    ours = h2h["ours"]
    h2h["ours_figures"] = _figures(ours)
    h2h["floor"] = {f: 0.0 for f in FIGURES}
    if h2h.get("aa"):
        aa = h2h["aa"]
        aa["vs"] = {f: stats.ratio_figure(ours[f"{f}_us"], aa[f"{f}_us"], floor=0.0) for f in FIGURES}
        h2h["floor"] = {f: aa_floor(aa["vs"][f]) for f in FIGURES}
    if h2h.get("minimal"):              # ours in the production worker / in its worker alone
        m = h2h["minimal"]
        m["vs"] = {f: stats.ratio_figure(ours[f"{f}_us"], m[f"{f}_us"], floor=h2h["floor"][f])
                   for f in FIGURES}
        m["figures"] = _figures(m)
    for x in h2h["incumbents"].values():
        x["figures"] = _figures(x)
        # paired with ours in the same worker (an incumbent's other configuration is timed
        # in the variant's worker alone, beside ours there)
        mine = h2h["minimal"] if x.get("worker") == "minimal" else ours
        x["vs"] = {f: stats.ratio_figure(mine[f"{f}_us"], x[f"{f}_us"], floor=h2h["floor"][f])
                   for f in FIGURES}
    h2h["best"] = best_sides(h2h["incumbents"])
    if h2h.get("hot"):                   # judged cold: the hot launches, a diagnostic, alike
        figures(h2h["hot"])


def _figures(side: dict) -> dict:
    return {f: stats.median_interval(side[f"{f}_us"]) for f in FIGURES + SHOWN if f"{f}_us" in side}


def best_sides(incumbents: dict) -> dict:
    """Per incumbent task, the side (its default, or another of its configurations) ours
    compares worst against, each paired with ours in its own worker: MPK's task at its best."""
    best = {}
    key = lambda side: incumbents[side]["vs"]["makespan"]["ratio"] or 0.0
    for side, x in incumbents.items():
        task = x.get("task", side)
        if task not in best or key(side) > key(best[task]):
            best[task] = side
    return best


def aa_floor(c: dict) -> float:
    """How far ours-against-ours reaches from 1: its interval's farther end (its median's
    distance where no interval came out), as a fraction."""
    if c["ratio"] is None:
        return 0.0
    return round(max(abs(c["ratio"] - 1.0), c["hi"] - 1.0, 1.0 - c["lo"]), 4)


def _no_figure(name: str, r: dict, incumbent: str | None) -> str:
    why = "; ".join(f"{m['incumbent'] or 'none'}: {m['why']}" for m in r.get("no_incumbent") or [])
    who = f"incumbent {incumbent}" if incumbent else "an incumbent"
    return f"{name}: no in-runtime figure of {who}" + (f" ({why})" if why else "")


def rule_outcomes(name: str, r: dict, rule: dict) -> list[tuple[str, str]]:
    h2h = r.get("head_to_head") or {}
    incumbents = h2h.get("incumbents") or {}
    names = [rule["incumbent"]] if "incumbent" in rule else \
        list(dict.fromkeys(x.get("task", side) for side, x in incumbents.items()))
    # against its default (the side named as the task) or its fastest configuration timed
    best = rule.get("against", "default") == "best"
    sides = [(h2h.get("best") or {}).get(n) if best else n for n in names]
    if not names or any(s not in incumbents for s in sides):
        return [("fail", _no_figure(name, r, rule.get("incumbent")))]
    fig, limit = rule.get("figure", "makespan"), rule["max_vs_incumbent"]
    out = []
    for inc, side in zip(names, sides):
        x = incumbents[side]
        c = x["vs"][fig]
        if c["ratio"] is None:
            out.append(("unsure", f"{name}: no paired {fig} samples against {inc}"))
            continue
        verdict = stats.at_most(c["lo"], c["hi"], limit)
        # ours as paired with it: in the worker alone for a configuration timed there
        there = x.get("worker") == "minimal"
        ours_med = (h2h["minimal"]["figures"] if there else h2h["ours_figures"])[fig]["median"]
        theirs_med = x["figures"][fig]["median"]
        floor = (h2h.get("floor") or {}).get(fig, 0.0)
        which = (f"{inc} at its best ({'its builder default' if x.get('default', True) else x['config']})"
                 if best else inc)
        out.append((verdict, f"{name}: in-runtime {fig} {ours_med:.2f} us is {c['ratio']:.3f}x "
                             f"{which}'s {theirs_med:.2f} us{' (both in the worker of the variant alone)' if there else ''} "
                             f"(limit {limit}x; 95% CI "
                             f"{c['lo']:.3f}-{c['hi']:.3f}x with the A/A floor of "
                             f"{100 * floor:.1f}%, n={c['n']})"))
    return out


def expected(spec: dict, payload: dict) -> list[str]:
    """What the thresholds are judged over: the variants, and the graphs of the blocks
    whose incumbents' chain runs on this run's runtime (a rule matching only the others'
    is not this run's to judge)."""
    from mpkbuild.wire.incumbents import block_graph_names
    return list(spec["codegen"]["variants"]) + block_graph_names(spec, payload["runtime"]["runtime"])


def judge(result: dict, thresholds: list, expected: list[str], **_ignored) -> dict:
    """A runner's passing result with its head to head figures judged; anything else (a
    numeric failure, a hang, a crash) is returned as it is."""
    if result.get("verdict") != "pass":
        return result
    variants = result.get("variants") or {}
    for r in variants.values():
        if r.get("head_to_head"):
            figures(r["head_to_head"])
    problems, unsure = [], []
    runtime = result.get("runtime", "v1")
    thresholds = [rule for rule in thresholds if "incumbent" not in rule
                  or rule["incumbent"] not in INCUMBENTS
                  or INCUMBENTS[rule["incumbent"]].runtime == runtime]
    # a rule over graphs this run does not have (a v1 block's on v2) is not this run's
    judged = [(rule, names) for rule in thresholds if (names := matching(rule["variants"], expected))]
    thresholds = [rule for rule, _ in judged]
    for rule, names in judged:
        for name in names:
            r = variants.get(name)
            if r is None:
                problems.append(f"{name}: the runtime gate has no result for it")
                continue
            r.setdefault("limits", []).append(rule)
            for verdict, text in rule_outcomes(name, r, rule):
                if verdict == "fail":
                    problems.append(text)
                elif verdict == "unsure":
                    unsure.append(text)
    met = result.get("message", "") + (f"; every in-runtime threshold met ({len(thresholds)} rules)"
                                       if thresholds else "")
    verdict, message = stats.gate_outcome(problems, unsure, met)
    return {**result, "verdict": verdict, "message": message, "problems": problems, "unsure": unsure,
            **composition_effect(variants)}


def composition_effect(variants: dict) -> dict:
    """Whether the worker's other tasks move ours (ours in the production worker / in the
    variant's worker alone, widened by the A/A floor) beyond what the gate can tell from itself: the
    graphs where they do, or that none does; nothing where ours was not timed in both."""
    effects = {name: r["head_to_head"]["minimal"]["vs"]["makespan"] for name, r in variants.items()
               if ((r.get("head_to_head") or {}).get("minimal") or {}).get("vs")}
    if not effects:
        return {}
    moved = {name: round(c["ratio"], 4) for name, c in effects.items() if c["verdict"] in ("faster", "slower")}
    return {"composition_effect": {"graphs": len(effects), "beyond_floor": moved}}
