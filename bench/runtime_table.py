"""The runtime gate's head to head as one markdown table, from the results a build left
(build/<kernel>/gpu/<gpu>/runtime.json) or from files named on the command line: per variant
and incumbent, ours' and the incumbent's in-runtime makespan (median [95% interval], µs)
and ours / incumbent with its interval and verdict, as the build's judge wrote them; beside
them each side's slowest task, start spread (first task start to last task start) and dispatch
(the graph's begin task's end to the first task start), medians.

    python bench/runtime_table.py [FILE ...]
"""
from __future__ import annotations

import glob
import json
import sys
from pathlib import Path


def rows(path: str):
    res = json.loads(Path(path).read_text())
    kernel = res.get("kernel") or Path(path).name.split(".")[0]
    runtime = res.get("runtime", "v1")
    for variant, r in sorted((res.get("variants") or {}).items()):
        h2h = r.get("head_to_head") or {}
        ours = h2h.get("ours_figures") or {}
        for inc, x in sorted((h2h.get("incumbents") or {}).items()):
            theirs = x.get("figures") or {}
            vs = (x.get("vs") or {}).get("makespan") or {}
            yield (kernel, runtime, variant, inc, ours, theirs, vs)
        if not h2h.get("incumbents"):
            why = "; ".join(m["why"] for m in r.get("no_incumbent") or []) or r.get("message", "")
            yield (kernel, runtime, variant, "none", {}, {}, {"verdict": r.get("verdict"), "why": why})


def fmt(f: dict | None) -> str:
    return f"{f['median']:.2f} [{f['lo']:.2f}, {f['hi']:.2f}]" if (f or {}).get("median") is not None else "—"


def parts(figs: dict) -> str:
    """slowest task / start spread / dispatch, medians (µs)."""
    m = lambda k: f"{figs[k]['median']:.2f}" if (figs.get(k) or {}).get("median") is not None else "—"  # noqa: E731
    return f"{m('slowcta')} / {m('startspread')} / {m('dispatch')}"


def main(argv: list[str]) -> int:
    files = argv or sorted(glob.glob("build/*/gpu/*/runtime.json"))
    print("| kernel | runtime | variant | incumbent | ours makespan µs | theirs µs | ours / theirs [95%] | verdict "
          "| slowest task / start spread / dispatch µs, ours | theirs |")
    print("|---|---|---|---|---:|---:|---|---|---:|---:|")
    for kernel, runtime, variant, inc, ours, theirs, vs in (r for f in files for r in rows(f)):
        ratio = f"{vs['ratio']:.3f} [{vs['lo']:.3f}, {vs['hi']:.3f}]" if vs.get("ratio") is not None else "—"
        verdict = vs.get("verdict") or "—"
        if inc == "none":
            verdict = f"{verdict} (no incumbent: {vs.get('why', '')[:60]})"
        print(f"| {kernel} | {runtime} | {variant} | {inc} | {fmt(ours.get('makespan'))} | "
              f"{fmt(theirs.get('makespan'))} | {ratio} | {verdict} | {parts(ours)} | {parts(theirs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
