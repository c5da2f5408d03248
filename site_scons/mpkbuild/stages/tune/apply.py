"""The tuned file: where it lives, the key it was made from (any change makes it stale),
and applying its values to the codegen section of a build for its GPU profile."""
from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.util.fsutil import dump_json, read_json, sha256_file, sha256_json, sha256_or_missing
from mpkbuild.stages.tune.space import candidate_problem, space
from mpkbuild.stages.tune.runtime_trial import trial_runtime
from mpkbuild.stages.tune.trials import trial_baseline_files, trial_perf


SECTIONS_READ = ("tune", "generators", "validate", "perf")   # "tune" holds the spec's codegen
# where the runtime's figure decides, the trial also wires the candidates into MPK and times
# them as the runtime section says (stages/tune/runtime_trial.py)
SECTIONS_READ_INSIDE_MPK = ("wiring", "runtime")


def sections_read(data: dict) -> tuple[str, ...]:
    return SECTIONS_READ + (SECTIONS_READ_INSIDE_MPK if data["tune"]["figure"] == "runtime" else ())


def tuned_file(root: Path | str, gpu_key: str, kernel: str) -> Path:
    return Path(root) / config.TUNED_DIRNAME / gpu_key / f"{kernel}.json"


# ---------------------------------------------------------------- the key
def key_files(k) -> list[Path]:
    """The project files the key signs: the body, validate's reference, then every baseline
    file the trials read (the same list as their inputs)."""
    from mpkbuild.stages import table as stages
    from mpkbuild.stages.gates import python_file
    return [k.body_source, python_file(k, stages.BY_NAME["validate"].gate), *trial_baseline_files(k)]


def key_templates(k) -> list[str]:
    """The tool's templates a candidate's code is rendered from: its spec header and
    harness, and, where the runtime's figure decides, the megakernel it is timed in."""
    from mpkbuild.stages.generate import tool_templates
    from mpkbuild.stages.runtime import MEGAKERNEL_TEMPLATES
    codegen = k.base.data["codegen"]
    names = [t for role in ("spec_header", "harness") for t in tool_templates(codegen, role)]
    return names + list(MEGAKERNEL_TEMPLATES if k.base.data["tune"]["figure"] == "runtime" else ())


def tune_key(k, fingerprint) -> dict:
    """What a tune was made from: any change makes it stale (and says which)."""
    from mpkbuild.util.toolchain import toolchain_fact
    base = k.base
    sp = space(base.data)
    sections = {s: base.signatures[s] for s in sections_read(base.data)}
    sections["perf"] = sha256_json(trial_perf(base.data))     # what the trials read of it
    if "runtime" in sections:
        sections["runtime"] = sha256_json(trial_runtime(base.data))
    body, reference, *baselines = key_files(k)
    return {
        "body": sha256_or_missing(body),
        "sections": sections,
        "reference": sha256_or_missing(reference),
        "baseline": {os.path.relpath(p, k.root): sha256_or_missing(p) for p in baselines},
        "templates": {t: sha256_or_missing(config.TEMPLATE_DIR / t) for t in key_templates(k)},
        "toolchain": toolchain_fact(),
        "gpu": fingerprint.signature() if fingerprint else "none",
        "space": sha256_json({v: [c.cid for c in s["candidates"]] for v, s in sp.items()})[:16],
        "candidates": sum(len(s["candidates"]) for s in sp.values()),
    }


KEY_WORDS = {"body": "the body source changed", "reference": "the reference changed",
             "baseline": "the torch baseline changed",
             "templates": "the tool's templates changed"}


def key_changes(old: dict, new: dict) -> list[str]:
    out = []
    for field in ("body", "reference", "baseline", "templates"):
        if old.get(field) != new.get(field):
            was, now = old.get(field), new.get(field)
            if was is None and field == "templates":
                out.append("it was made before its key signed the tool's templates")
                continue
            files = sorted(f for f in set(was or {}) | set(now) if (was or {}).get(f) != now.get(f)) \
                if isinstance(now, dict) and isinstance(was, dict) else []
            out.append(KEY_WORDS[field] + (f" ({', '.join(files)})" if files else ""))
    unsigned = [s for s in new["sections"] if s not in (old.get("sections") or {})]
    if unsigned:
        out.append(f"it was made before its key signed the spec's {' and '.join(unsigned)} "
                   f"section{'s' if len(unsigned) > 1 else ''}")
    for s, sig in new["sections"].items():
        if s not in unsigned and old["sections"][s] != sig:
            out.append(f"spec section {s if s != 'tune' else 'tune (or the codegen it tunes)'} changed")
    if old.get("toolchain") != new["toolchain"]:
        out.append(f"toolchain {str(old.get('toolchain')).split(';')[0]} -> {new['toolchain'].split(';')[0]}")
    if old.get("gpu") != new["gpu"]:
        out.append(f"GPU {old.get('gpu')} -> {new['gpu']}")
    if old.get("space") != new["space"]:
        out.append(f"search space changed ({old.get('candidates')} -> {new['candidates']} candidates)")
    return out


# ---------------------------------------------------------------- using a tuned file
def spec_edited(now: dict, tuned_from: dict | None) -> str | None:
    """Why a variant's pick is not applied: the spec's values of the tuned symbols are not
    the ones the tune started from."""
    changed = {s: (was, now.get(s)) for s, was in (tuned_from or {}).items() if now.get(s) != was}
    if not changed:
        return None
    said = ", ".join(f"{s} {was} -> {is_}" for s, (was, is_) in changed.items())
    return f"the spec's values changed since the tune ({said}): the spec's are used until it is re-tuned"


def apply_tuned(k, fingerprint):
    """The kernel as the build for this GPU profile sees it: the spec's codegen with the
    tuned file's values, or the kernel unchanged (no profile, no file, no tune section).
    A variant keeps the spec's values when they are not the ones the tune started from (the
    user edited them since: a pick over other values would silently undo the edit), or when
    the tuned values no longer make a valid variant."""
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
        why = spec_edited(cg["variants"][variant], entry.get("spec")) or \
            candidate_problem(data, variant, values, constraints=False)
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
    from mpkbuild.stages.generate.section import SECTION as CODEGEN
    data = json.loads(dump_json(data))
    sections = dict(k.base.sections)
    sections["codegen"] = {key: data[key] for key in CODEGEN.keys}
    signatures = {**k.base.signatures, "codegen": sha256_json(sections["codegen"])}
    spec = replace(k.base, data=data, sections=sections, signatures=signatures)
    return replace(k, spec=spec, base_spec=k.base, tuned=tuned)
