"""Every kernel through every gate on this GPU, in one run: the perf table of the catalog.

    python bench/catalog.py [--out DIR] [kernel ...]

Copies the project to a temporary folder, runs `scons -k stage=review` (GPU gates one at a
time), and prints, per kernel and variant: graph-timed hot/cold us, slowCTA, the torch
baseline's hot us, the ratio, and bandwidth as a fraction of the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("kernels", nargs="*")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mpk-catalog-"))
    for name in ("SConstruct", "site_scons", "specs", "kernels", "wiring"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp / name)
    kernel_arg = [f"kernel={','.join(args.kernels)}"] if args.kernels else []
    proc = subprocess.run([sys.executable, "-m", "SCons", "-Q", "-k", "-j8", "stage=review", *kernel_arg],
                          cwd=tmp, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "catalog.log").write_text(log)
        if (tmp / "build" / "review.md").exists():
            shutil.copy2(tmp / "build" / "review.md", args.out / "summary.md")
    print(f"{'kernel/variant':<36} {'verdict':<8} {'hot us':>7} {'cold us':>7} {'slowCTA':>7} "
          f"{'torch us':>8} {'x torch':>7} {'BW cold':>7}")
    for perf_path in sorted(tmp.glob("build/*/gpu/*/perf.json")):
        perf = json.loads(perf_path.read_text())
        val = json.loads((perf_path.parent / "validate.json").read_text())
        kname = perf_path.parts[-4]
        print(f"{kname:<36} validate {val['verdict']}; perf {perf['verdict']}: {perf.get('message', '')[:90]}")
        for name, v in perf.get("variants", {}).items():
            cold = v.get("cold", {}).get("median_us", float("nan"))
            print(f"  {name:<34} {'':<8} {v['hot']['median_us']:>7.2f} {cold:>7.2f} "
                  f"{v['slowcta']['slowest_task_us']:>7.2f} {v['baseline_hot']['median_us']:>8.2f} "
                  f"{v['vs_baseline_hot']:>6.2f}x {v.get('cold_bandwidth_fraction', float('nan')):>7.1%}")
        if args.out:
            shutil.copy2(perf_path, args.out / f"{kname}.perf.json")
            shutil.copy2(perf_path.parent / "validate.json", args.out / f"{kname}.validate.json")
    for line in log.splitlines():
        if line.startswith("mpk: error") or line.startswith("scons: ***"):
            print(line[:200])
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
