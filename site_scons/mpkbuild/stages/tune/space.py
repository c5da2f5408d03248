"""The search space: a variant's candidates from `tune.space`, the spec's own configuration
first, then the nearest others that meet the constraints and the loader's rules."""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass

from mpkbuild.util import config, expr
from mpkbuild.util.fsutil import dump_json, sha256_json


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


def _split(cg: dict, values: dict) -> tuple[dict, dict]:
    levers = cg.get("levers", {})
    return ({k: v for k, v in values.items() if k not in levers},
            {k: v for k, v in values.items() if k in levers})


def candidate_problem(data: dict, variant: str, values: dict, constraints: bool = True) -> str | None:
    """Why a configuration of one variant is not a candidate (None: it is one): a
    constraint it breaks, or a rule of the loader's it breaks for that variant."""
    from mpkbuild.stages.generate.plan import SmemPlanError, smem_layout, variant_tensors
    cg = data["codegen"]
    symbols_set, lever_set = _split(cg, values)
    binding = {**cg["variants"][variant], **symbols_set}
    levers = {k: bool(v.get("default", False)) for k, v in cg.get("levers", {}).items()}
    levers.update(lever_set)
    symbols = {**expr.constants(cg), **binding}
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


def space(data: dict) -> dict:
    """The candidates (computed once per tune section and codegen in a process)."""
    key = sha256_json({"tune": data["tune"], "codegen": data["codegen"]})
    if key not in _SPACES:
        _SPACES[key] = _space(data)
    return _SPACES[key]


def _space(data: dict) -> dict:
    """{variant: {"candidates": [Candidate], "excluded": {reason kind: count},
    "static_rejected": [(values, why)]}} for the tuned variants."""
    from mpkbuild.stages.tune.section import tuned_variants
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


_SPACES: dict = {}
