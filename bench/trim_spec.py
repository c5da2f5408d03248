"""Trim a copy of a spec to some of its variants, for a GPU call too short for all of them.

    python bench/trim_spec.py SPEC.yaml REGEX [--keep-blocks]

Keeps the codegen variants whose names REGEX finds (and wiring.test_variant), drops the
runtime blocks (kept, with their thresholds and the variants they run, under --keep-blocks:
a call that times the blocks without every variant) and the tune section, and drops every
rule or variant list whose globs no longer match a kept variant, so the trimmed spec still
loads. It rewrites SPEC.yaml in place without its comments: run it on a throwaway copy
(bench/runtime_ab.sh does, on the box), never on the tree you commit.
"""
from __future__ import annotations

import fnmatch
import re
import sys

import yaml


def trim(data: dict, keep: str, keep_blocks: bool = False) -> dict:
    find = re.compile(keep)
    cg = data["codegen"]
    test_variant = (data.get("wiring") or {}).get("test_variant")
    # with the blocks, the spec's own variants they run at each batch
    in_blocks = {l["variant"].format(batch=b) for block in (data.get("runtime") or {}).get("blocks", [])
                 for l in block["layers"] if l["kernel"] == data["kernel"] for b in block["batches"]} \
        if keep_blocks else set()
    kept = [v for v in cg["variants"] if find.search(v) or v == test_variant or v in in_blocks]
    if not kept:
        raise SystemExit(f"trim_spec: {keep!r} keeps none of {list(cg['variants'])}")
    cg["variants"] = {v: cg["variants"][v] for v in kept}
    data.pop("tune", None)

    def live(glob) -> bool:
        globs = glob if isinstance(glob, list) else [glob]
        return any(fnmatch.filter(kept, g) or (keep_blocks and g.startswith("block:")) for g in globs)

    for section in ("perf", "runtime"):
        rules = (data.get(section) or {}).get("thresholds")
        if isinstance(rules, list):
            data[section]["thresholds"] = [r for r in rules if live(r["variants"])]
    runtime = data.get("runtime") or {}
    if not keep_blocks:
        runtime.pop("blocks", None)
    if isinstance(runtime.get("incumbent"), list):
        runtime["incumbent"] = [r for r in runtime["incumbent"] if live(r["variants"])]
    profile = data.get("profile") or {}
    if isinstance(profile.get("variants"), list):
        profile["variants"] = [g for g in profile["variants"] if live(g)] or [kept[0]]
    expect = (profile.get("thresholds") or {}).get("expect")
    if isinstance(expect, list):
        profile["thresholds"]["expect"] = [r for r in expect if live(r["variants"])]
    return data


def main(argv: list[str]) -> int:
    keep_blocks = "--keep-blocks" in argv
    path, keep = [a for a in argv if a != "--keep-blocks"]
    with open(path) as f:
        data = yaml.safe_load(f)
    with open(path, "w") as f:
        yaml.safe_dump(trim(data, keep, keep_blocks), f, sort_keys=False, width=120)
    print(f"trim_spec: {path}: kept {', '.join(data['codegen']['variants'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
