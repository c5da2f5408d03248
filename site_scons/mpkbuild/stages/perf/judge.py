"""The perf gate's verdict, made on the build side from the figures its runners timed.

The runners only time (verdict "timed", or hang/crash); the spec's thresholds are applied
here, the same way whichever executor ran them.
Standard library only: the build must not import torch.

Every figure is judged with its uncertainty (util.stats): a ratio to a baseline by the
interval of the median of its paired ratios, a time or a bandwidth fraction by the
interval of the median time. A rule is `pass` when the whole interval meets it, `fail`
when the whole interval misses it, `unsure` otherwise; the gate's verdict is fail if any
rule failed (or a regression against the last accepted result for this GPU is confirmed,
perf_history/: time and ratio to the baseline both confirm it), else unsure if any rule is
unsure (or only one of the two confirms a regression), else pass. `unsure` is not a pass: the
check node fails on it and the review shows it as unsure. A figure without samples (a
result from before the samples were kept) is judged on its point value and says so.
"""
from __future__ import annotations

import fnmatch

from mpkbuild.util import perfspec, stats

LIMIT_KEYS = ("min_bandwidth_fraction", "max_time_vs_baseline", "max_us", "time_figure", "baseline")
DEFAULT_MAX_REGRESSION = 0.03
FIGURES = ("hot", "cold")


def limits_by_variant(variants, thresholds: list) -> dict[str, list[dict]]:
    """Each variant's rules (those whose glob matches it): recorded with its figures, so
    the review shows what each number was held to."""
    out: dict[str, list[dict]] = {name: [] for name in variants}
    for rule in thresholds:
        for name in fnmatch.filter(variants, rule["variants"]):
            out[name].append({k: rule[k] for k in ("variants", *LIMIT_KEYS) if k in rule})
    return out


def time_interval(fig: dict) -> tuple[float, float, float]:
    """(median, lo, hi) microseconds of one figure: its samples' median interval, or the
    recorded one, or the point value."""
    if fig.get("samples_us"):
        return stats.median_ci(fig["samples_us"])
    med = fig["median_us"]
    lo, hi = fig.get("ci_us") or (med, med)
    return med, lo, hi


def baseline_figure(r: dict, name: str, fig: str) -> dict | None:
    b = (r.get("baselines") or {}).get(name)
    if b is not None:
        return b.get(fig)
    if name == perfspec.PRIMARY:
        return r.get(f"baseline_{fig}")
    return None


def comparison(r: dict, name: str, fig: str) -> dict | None:
    """kernel / baseline `name` on figure `fig`: {ratio, lo, hi, n, verdict[, point]}."""
    base = baseline_figure(r, name, fig)
    if base is None or r.get(fig) is None:
        return None
    ours = perfspec.paired_kernel(r, fig, base)      # the kernel's run beside this baseline
    if ours.get("samples_us") and base.get("samples_us"):
        floor = (ours.get("sampling") or {}).get("capture_floor")
        return stats.ratio_figure(ours["samples_us"], base["samples_us"], floor=floor)
    legacy = r.get(f"vs_baseline_{fig}") if name == perfspec.PRIMARY else None
    ratio = legacy if isinstance(legacy, (int, float)) else ours["median_us"] / base["median_us"]
    return {"ratio": ratio, "lo": ratio, "hi": ratio, "n": 0, "point": True,
            "verdict": stats.compare(ratio, ratio, ratio)}


def comparisons(r: dict) -> dict:
    """{baseline: {figure: comparison}} for every baseline the figures hold."""
    names = list(r.get("baselines") or {}) or ([perfspec.PRIMARY] if "baseline_hot" in r else [])
    out = {}
    for name in names:
        out[name] = {fig: c for fig in FIGURES if (c := comparison(r, name, fig)) is not None}
    return out


def _ci_text(c: dict) -> str:
    return "no interval: one value" if c.get("point") else f"95% CI {c['lo']:.3f}-{c['hi']:.3f}x, n={c['n']}"


def rule_outcomes(name: str, r: dict, rule: dict) -> list[tuple[str, str]]:
    """[(verdict, text)] for each limit of one rule on one variant's figures."""
    out = []
    if "min_bandwidth_fraction" in rule:
        key = "cold" if "cold_bandwidth_fraction" in r else "hot"
        got = r[f"{key}_bandwidth_fraction"]
        med, lo_us, hi_us = time_interval(r[key])
        lo, hi = got * med / hi_us, got * med / lo_us      # fraction ~ 1 / time
        verdict = stats.at_least(lo, hi, rule["min_bandwidth_fraction"])
        ceiling = (r.get("ceiling") or {}).get("mix", "1:1")
        what = "copy bandwidth" if ceiling == "1:1" else f"the {ceiling} ceiling"
        interval = "" if lo == hi else f" (95% CI {lo:.1%}-{hi:.1%})"
        out.append((verdict, f"{name}: {key} bandwidth {got:.1%} of {what}{interval} "
                             f"{'<' if verdict == 'fail' else 'vs'} {rule['min_bandwidth_fraction']:.0%}"))
    fig = rule.get("time_figure", "hot")
    if ("max_time_vs_baseline" in rule or "max_us" in rule) and fig not in r:
        out.append(("fail", f"{name}: no {fig} figure to judge its time by (perf.cold is off)"))
        return out
    label = "" if fig == "hot" else f"{fig} "
    if "max_time_vs_baseline" in rule:
        bname = rule.get("baseline", perfspec.PRIMARY)
        c = comparison(r, bname, fig)
        if c is None:
            out.append(("fail", f"{name}: no {fig} figure of baseline {bname!r}"))
        else:
            verdict = stats.at_most(c["lo"], c["hi"], rule["max_time_vs_baseline"])
            base = baseline_figure(r, bname, fig)
            who = "the baseline's" if bname == perfspec.PRIMARY else f"{bname}'s"
            text = (f"{name}: {label}{r[fig]['median_us']:.2f} us is {c['ratio']:.2f}x {who} "
                    f"{base['median_us']:.2f} us (limit {rule['max_time_vs_baseline']}x")
            text += ")" if c.get("point") else f"; {_ci_text(c)})"
            out.append((verdict, text))
    if "max_us" in rule:
        med, lo, hi = time_interval(r[fig])
        verdict = stats.at_most(lo, hi, rule["max_us"])
        interval = "" if lo == hi else f" (95% CI {lo:.2f}-{hi:.2f})"
        out.append((verdict, f"{name}: {label}{med:.2f} us{interval} {'>' if verdict == 'fail' else 'vs'} "
                             f"max_us {rule['max_us']}"))
    return out


def _outcomes(variants: dict, limits: dict[str, list[dict]]) -> tuple[list[str], list[str]]:
    """(failures, unsure ones): each rule applies to the variants its glob matches.
    Bandwidth is judged on the cold figure when there is one (DRAM, not L2); time limits on
    the hot figure, or on the cold one where the rule says `time_figure: cold` (a working
    set over twice the L2: the hot figure is one buffer set's placement, the cold one the
    rotation's)."""
    problems, unsure = [], []
    for name, rules in limits.items():
        for rule in rules:
            for verdict, text in rule_outcomes(name, variants[name], rule):
                if verdict == "fail":
                    problems.append(text)
                elif verdict == "unsure":
                    unsure.append(text)
    return problems, unsure


def history_delta(variants: dict, entry: dict | None, max_regression: float) -> tuple[dict, list[str], list[str]]:
    """Each variant's figures over the last accepted ones for this GPU (perf_history/):
    {variant: {figure: {ratio, lo, hi, verdict, judged, vs_baseline}}}, the regressions
    confirmed and the ones only half-confirmed.

    Two runs are not paired, so each comparison takes the conservative interval of
    util.stats.unpaired_ratio, and two of them must agree: the time against the accepted
    time, and the kernel / baseline ratio against the accepted ratio (each run's own paired
    interval). A whole process can sit 20% off at a 1.3 us shape (bench/RESULTS.md section 0),
    which moves the time and not the ratio; a new torch moves the ratio and not the time. A
    regression is confirmed when both intervals lie above 1 + max_regression; when only one
    does, the figure is `unconfirmed` and the gate unsure (never a pass).

    One figure per variant is judged: the cold one where both results have it, else hot.
    The hot figure replays one buffer set, so where the working set is a good part of the
    L2 it depends on where that set landed, which changes from process to process: on an
    H200 linear_v2 m8 4096x4096 (32 MB of weight) moved 4.8% hot (its torch ratio 9%) between
    two runs of the same code while every cold figure stayed within 3%. The other figure's
    delta is shown (judged: false). An entry without ratios is judged on its time alone."""
    if not entry:
        return {}, [], []
    deltas, regressions, unsure = {}, [], []
    for name, r in variants.items():
        before = (entry.get("variants") or {}).get(name)
        if not before:
            continue
        judged = "cold" if "cold" in r and "cold" in before else "hot"
        for fig in FIGURES:
            if fig not in r or fig not in before:
                continue
            now_t = time_interval(r[fig])
            b = before[fig]
            d = stats.unpaired_ratio(now_t, (b["median_us"], b.get("lo", b["median_us"]), b.get("hi", b["median_us"])))
            dr = None
            c, rb = comparison(r, perfspec.PRIMARY, fig), (before.get("vs_baseline") or {}).get(fig)
            if c is not None and not c.get("point") and rb is not None:
                dr = stats.unpaired_ratio((c["ratio"], c["lo"], c["hi"]), (rb["ratio"], rb["lo"], rb["hi"]))
                d["vs_baseline"] = dr
            d["judged"] = fig == judged
            over = [x["lo"] > 1.0 + max_regression for x in (d, dr) if x is not None]
            if d["judged"] and any(over):
                text = (f"{name}: {fig} {now_t[0]:.2f} us is {d['ratio']:.3f}x the accepted "
                        f"{b['median_us']:.2f} us (95% CI {d['lo']:.3f}-{d['hi']:.3f}x")
                if dr is not None:
                    text += (f"; its ratio to {perfspec.PRIMARY} is {dr['ratio']:.3f}x the accepted one "
                             f"(95% CI {dr['lo']:.3f}-{dr['hi']:.3f}x)")
                text += f", over 1 + {max_regression:g}"
                if all(over):
                    d["verdict"] = "regressed"
                    regressions.append(text + ")")
                else:
                    d["verdict"] = "unconfirmed"
                    unsure.append(text + f": {'the time only' if over[0] else 'the ratio only'})")
            else:
                d["verdict"] = stats.compare(d["ratio"], d["lo"], d["hi"])
            deltas.setdefault(name, {})[fig] = d
    return deltas, regressions, unsure


def expected(spec: dict, payload: dict) -> list[str]:
    """What the thresholds are judged over: every variant."""
    return list(spec["codegen"]["variants"])


def judge(result: dict, thresholds: list, expected: list[str], history: dict | None = None,
          max_regression: float = DEFAULT_MAX_REGRESSION) -> dict:
    """A runner's "timed" result (every expected variant's figures) into pass, fail or
    unsure. `history`: the last accepted entry of this kernel on this GPU (or None).
    Anything else (hang, crash, a stand-in's verdict) is returned as it is."""
    if result.get("verdict") != "timed":
        return result
    variants = result.get("variants") or {}
    missing = [v for v in expected if v not in variants]
    if missing:
        return {**result, "verdict": "crash",
                "message": f"perf: no figures for {', '.join(missing)} (a runner stopped early)"}
    ordered = {name: variants[name] for name in expected}
    limits = limits_by_variant(ordered, thresholds)
    for name, rules in limits.items():
        ordered[name]["limits"] = rules
        ordered[name]["vs"] = comparisons(ordered[name])
    problems, unsure = _outcomes(ordered, limits)
    deltas, regressions, half = history_delta(ordered, history, max_regression)
    for name, d in deltas.items():
        ordered[name]["history"] = d
    problems += regressions
    unsure += half
    verdict, message = stats.gate_outcome(problems, unsure, "all thresholds met")
    hist = None
    if history:
        hist = {"accepted": history.get("accepted"), "commit": history.get("commit"),
                "max_regression": max_regression, "regressions": regressions, "unsure": half}
    return {**result, "variants": ordered, "problems": problems, "unsure": unsure,
            "history": hist, "verdict": verdict, "message": message}
