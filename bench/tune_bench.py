"""On the GPU box: one `scons stage=tune` call per kernel, timed, then per variant the
committed (spec) config, the tuned config and both times with their intervals.

    python bench/tune_bench.py [-jN] [gpus=0,1] [kernels=linear_v2,silu_mul_v2,rmsnorm_v2] [mpk_root=PATH]

Each call compiles the kernel's candidates on the CPU cores (-jN), validates and times them
on the GPU(s) and writes tuned/<gpu-profile>/<kernel>.json (commit it to use it). Output:
one table per kernel and the wall time of its call; paste it into bench/RESULTS.md. A
second run re-times nothing (the ledger is cached): `rm -rf build/<kernel>/gpu/*/tune` to
measure from scratch. A trial past its variant's `tune.budget.seconds` is not run (counted
apart; a larger budget runs it). A kernel whose spec tunes on the in-runtime figure
(`tune.figure: runtime`: all three, and the fused linears) needs the MPK checkout: mpk_root=.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("linear_v2", "silu_mul_v2", "rmsnorm_v2")


def fmt(iv: dict | None) -> str:
    return f"{iv['median']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}]" if iv else "—"


def cfg(values: dict | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (values or {}).items()) or "—"


def main(argv: list[str]) -> int:
    jobs = next((a for a in argv if a.startswith("-j")), "-j8")
    gpus = [a for a in argv if a.startswith(("gpus=", "mpk_root="))]
    kernels = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("kernels=")), KERNELS)
    scons = [sys.executable, "-m", "SCons", "-Q", jobs, "stage=tune", *gpus]
    worst = 0
    for kernel in kernels:
        started = time.monotonic()
        proc = subprocess.run([*scons, f"kernel={kernel}"], cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - started
        lines = proc.stdout.splitlines()
        skipped = sum(1 for line in lines if line.lstrip().startswith("trial ") and ": not run: " in line)
        trials = sum(1 for line in lines if line.startswith("trial ")) - skipped
        compiles = sum(1 for line in lines if line.startswith("tunecc "))
        print(f"\n## {kernel}: scons stage=tune {jobs} {' '.join(gpus)} -> exit {proc.returncode}, "
              f"wall {wall:.1f} s ({compiles} candidates compiled, {trials} trials run, "
              f"{skipped} not run: time budget)")
        if proc.returncode != 0:
            print(proc.stdout[-3000:] + proc.stderr[-3000:])
            worst = 1
        files = sorted((ROOT / "tuned").glob(f"*/{kernel}.json"), key=lambda p: p.stat().st_mtime)
        if not files:
            print("no tuned file written")
            worst = 1
            continue
        record = json.loads(files[-1].read_text())
        print(f"tuned file {files[-1].relative_to(ROOT)}: {record['verdict']}: {record['message']}")
        print(f"figure: {record['figure']} µs; decision on {record['interval']}")
        if record.get("levers"):
            print("levers: " + ", ".join(f"{n} {'on' if v else 'off'}" for n, v in record["levers"].items()))
        print("| variant | committed | µs [interval], first / again | tuned | µs [interval] | tuned/committed (ratio median) | candidates timed/rejected/not run |")
        print("|---|---|---|---|---|---:|---|")
        for variant, w in record["variants"].items():
            rows = record["ledger"][variant]
            spec_row = next((r for r in rows if r.get("current")), {})
            timed = sum(1 for r in rows if r["verdict"] == "timed")
            rejected = sum(1 for r in rows if r["verdict"] == "rejected")
            not_run = sum(1 for r in rows if r["verdict"] == "not run")
            vs = f"{w['vs_spec']:.3f}" if w.get("vs_spec") else "—"
            mark = " **faster**" if w.get("from") == "tune" else ""
            again = (spec_row.get("again") or {}).get("time_us")
            print(f"| {variant} | {cfg(spec_row.get('config'))} | {fmt(spec_row.get('time_us'))} / {fmt(again)} | "
                  f"{cfg(w.get('config'))}{mark} | {fmt(w.get('time_us'))} | {vs} | {timed}/{rejected}/{not_run} |")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
