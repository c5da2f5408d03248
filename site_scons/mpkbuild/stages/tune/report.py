"""The tune stage's part of the review: what won per variant, what lost and by how much,
the spec's two trials, the levers."""
from __future__ import annotations

from mpkbuild.stages.tune.pick import spec_measurements
from mpkbuild.util.fsutil import read_json

REVIEW = "review.md.j2"           # the tune section of review.md: winners, losers, levers
REVIEW_LEAD = None
HELPERS: dict = {}                # functions every review template may call
FILES = None                      # no file of its own beside review.md


def _cfg(values: dict | None) -> str:
    return " ".join(f"{k}={('on' if v else 'off') if isinstance(v, bool) else v}"
                    for k, v in (values or {}).items())


def _interval_us(e: dict | None) -> str | None:
    t = (e or {}).get("time_us")
    return f"{t['median']:.2f} [{t['lo']:.2f}, {t['hi']:.2f}]" if t else None


def tune_review(record: dict | None, codegen: dict, applied: dict | None, link: str,
                skipped: dict | None = None) -> dict | None:
    """What won, what lost and by how much, per tuned variant; the levers' state; which
    variants' picks the build does not apply (`skipped`: variant -> why), and what it uses."""
    if not record:
        return None
    levers = {name: {"default": bool(l.get("default")), "applied": bool((applied or {}).get(name, l.get("default"))),
                     "tuned": ("on" if record.get("levers", {}).get(name) else "off")
                     if name in record.get("levers", {}) else "not in the space"}
              for name, l in codegen.get("levers", {}).items()}
    variants = {}
    for v, w in (record.get("variants") or {}).items():
        rows = record.get("ledger", {}).get(v, [])
        losers = sorted((e for e in rows if e.get("cid") != w.get("cid") or e.get("cid") is None),
                        key=lambda e: (e.get("verdict") != "timed", e.get("vs_winner") or 0))
        timed = [e for e in losers if e.get("verdict") == "timed"]
        spec = next((e for e in rows if e.get("current")), None)
        kept = (skipped or {}).get(v)
        used = ({s: codegen.get("variants", {}).get(v, {}).get(s) for s in w.get("config") or {}}
                if kept else w.get("config"))
        variants[v] = {
            "config": _cfg(used), "spec": _cfg(w.get("spec")), "from": "spec" if kept else w.get("from"),
            "tuned": _cfg(w.get("config")), "kept": kept,
            "time": _interval_us(w),
            # the spec's config, timed first and again after the others (stages/tune/)
            "spec_times": [t for t in map(_interval_us, spec_measurements(spec)) if t] if spec else [],
            "vs_spec": f"{w['vs_spec']:.3f}×" if w.get("vs_spec") else None,
            "runner_up": (f"{_cfg(timed[0]['config'])}, +{100 * (timed[0]['vs_winner'] - 1):.1f}%"
                          if timed and timed[0].get("vs_winner") else None),
            "rejected": sum(1 for e in rows if e.get("verdict") == "rejected"),
            "losers": [{"config": _cfg(e.get("config")), "verdict": e.get("verdict"),
                        "time": _interval_us(e),
                        "vs_winner": f"{e['vs_winner']:.3f}×" if e.get("vs_winner") else None,
                        "message": (e.get("message") or "").replace("|", "/")[:160]} for e in losers]}
    return {"verdict": record.get("verdict", "?"), "message": record.get("message", ""),
            "figure": record.get("figure"), "interval": record.get("interval"), "levers": levers,
            "variants": variants, "file": link.rsplit("/", 1)[-1], "link": link}


def review_sources(g, k) -> list[str]:
    """What the part judges an applied tuned file's key against (`input_changes`): the spec
    sections, project files and tool templates the key signs, so an edit there re-renders the review. The
    tuned file itself is not among them: it is the tune stage's target, which review does not
    run; its hash is a fact of the review node (stages.spec.tuned_fact)."""
    if not k.tuned:
        return []
    from mpkbuild.stages.tune.apply import key_files, key_templates, sections_read
    return [*(k.rel.section_file(s) for s in sections_read(k.base.data)), *(g.rel(p) for p in key_files(k)),
            *(g.pkg("templates", t) for t in key_templates(k))]


def input_changes(record: dict, k) -> list[str]:
    """What this kernel's inputs changed since the tuned file was made (body, reference,
    baseline, spec sections, search space). The GPU and the toolchain are left to the tune
    node, which sees the GPU: a review may be rendered on another machine."""
    from mpkbuild.stages.tune.apply import key_changes, tune_key
    old = record.get("key") or {}
    new = {**tune_key(k, None), "gpu": old.get("gpu"), "toolchain": old.get("toolchain")}
    return key_changes(old, new)


def part(inputs) -> dict | None:
    """The tuned file this kernel's spec has its values from, when there is one: stale, not
    its recorded verdict, once the inputs it was tuned from have changed."""
    k = inputs.kernel
    if k is None or not k.tuned:
        return None
    path = k.root / k.tuned["path"]
    record = read_json(path)
    data = tune_review(record, k.base.data["codegen"],
                       {n: l["default"] for n, l in k.spec.data["codegen"].get("levers", {}).items()},
                       inputs.rel(path), k.tuned.get("skipped"))
    if data is None:
        return None
    changes = input_changes(record, k)
    if changes:
        data = {**data, "verdict": "stale",
                "message": f"tuned from other inputs ({'; '.join(changes)}): its picks are applied as "
                           f"committed (except where noted below), its figures are not this spec's; "
                           f"`scons kernel={k.name} stage=tune` on this GPU re-tunes. "
                           f"Recorded: {data['verdict']}: {data['message']}"}
    return {**data, "counted": [], "cases": [], "cells": {}}
