"""The perf gate's verdict, made on the build side from the figures its runners timed.

The runners only time (verdict "timed", or hang/crash); the spec's thresholds are applied
here, the same way whichever executor ran them.
Standard library only: the build must not import torch.
"""
from __future__ import annotations

import fnmatch

LIMIT_KEYS = ("min_bandwidth_fraction", "max_time_vs_baseline", "max_us", "time_figure")


def limits_by_variant(variants, thresholds: list) -> dict[str, list[dict]]:
    """Each variant's rules (those whose glob matches it): recorded with its figures, so
    the review shows what each number was held to."""
    out: dict[str, list[dict]] = {name: [] for name in variants}
    for rule in thresholds:
        for name in fnmatch.filter(variants, rule["variants"]):
            out[name].append({k: rule[k] for k in ("variants", *LIMIT_KEYS) if k in rule})
    return out


def check_thresholds(variants: dict, thresholds: list) -> list[str]:
    """Each rule applies to the variants its glob matches. Bandwidth is judged on the cold
    figure when there is one (DRAM, not L2); time limits on the hot figure, or on the cold
    one where the rule says `time_figure: cold` (a working set over twice the L2: the hot
    figure is one buffer set's placement, the cold one the rotation's)."""
    return _problems(variants, limits_by_variant(variants, thresholds))


def _problems(variants: dict, limits: dict[str, list[dict]]) -> list[str]:
    problems = []
    for name, rules in limits.items():
        r = variants[name]
        for rule in rules:
            if "min_bandwidth_fraction" in rule:
                key = "cold" if "cold_bandwidth_fraction" in r else "hot"
                got = r[f"{key}_bandwidth_fraction"]
                if got < rule["min_bandwidth_fraction"]:
                    problems.append(f"{name}: {key} bandwidth {got:.1%} of copy bandwidth < "
                                    f"{rule['min_bandwidth_fraction']:.0%}")
            fig = rule.get("time_figure", "hot")
            if ("max_time_vs_baseline" in rule or "max_us" in rule) and fig not in r:
                problems.append(f"{name}: no {fig} figure to judge its time by (perf.cold is off)")
                continue
            label = "" if fig == "hot" else f"{fig} "
            if "max_time_vs_baseline" in rule and r[f"vs_baseline_{fig}"] > rule["max_time_vs_baseline"]:
                problems.append(f"{name}: {label}{r[fig]['median_us']:.2f} us is {r[f'vs_baseline_{fig}']:.2f}x "
                                f"the baseline's {r[f'baseline_{fig}']['median_us']:.2f} us "
                                f"(limit {rule['max_time_vs_baseline']}x)")
            if "max_us" in rule and r[fig]["median_us"] > rule["max_us"]:
                problems.append(f"{name}: {label}{r[fig]['median_us']:.2f} us > max_us {rule['max_us']}")
    return problems


def judge(result: dict, thresholds: list, expected: list[str]) -> dict:
    """A runner's "timed" result (every expected variant's figures) into pass or fail.
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
    problems = _problems(ordered, limits)
    return {**result, "variants": ordered, "problems": problems,
            "verdict": "fail" if problems else "pass",
            "message": "; ".join(problems) if problems else "all thresholds met"}
