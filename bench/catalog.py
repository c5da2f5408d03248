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
    # the project as a user has it: its own wiring/ only where it has one (the surface ships in
    # site_scons), its tuned files, which the GPU's profile picks
    for name in ("SConstruct", "site_scons", "specs", "kernels", "tuned", "wiring"):
        src = REPO / name
        if src.exists():
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
    for bw_path in sorted(tmp.glob("build/gpu/*/bandwidth.json")) + sorted(tmp.glob("build/*/bandwidth.json")):
        bw = json.loads(bw_path.read_text())
        ceil = bw.get("ceilings_Bps") or {}
        print(f"ceilings ({bw_path.parent.name}): " + ", ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in ceil.items()))
        if args.out:
            shutil.copy2(bw_path, args.out / "bandwidth.json")
    print(f"{'kernel/variant':<30} {'hot us':>7} {'cold us':>7} {'slowCTA':>7}  baselines hot us (ours/them [95% CI] verdict)  "
          f"{'BW cold':>7} ceiling")
    for perf_path in sorted(tmp.glob("build/*/gpu/*/perf.json")):
        perf = json.loads(perf_path.read_text())
        val = json.loads((perf_path.parent / "validate.json").read_text())
        kname = perf_path.parts[-4]
        print(f"{kname} validate {val['verdict']}; perf {perf['verdict']} ({perf.get('elapsed_s', '?')} s): "
              f"{perf.get('message', '')[:160]}")
        for name, v in perf.get("variants", {}).items():
            cold = v.get("cold", {}).get("median_us", float("nan"))
            cells = []
            for b, entry in (v.get("baselines") or {}).items():
                if "error" in entry:
                    cells.append(f"{b} ERROR {entry['error'][:200]}")
            for b, c in (v.get("vs") or {}).items():
                if "hot" not in c:
                    continue
                bh = v["baselines"][b]["hot"]["median_us"] if "baselines" in v else v["baseline_hot"]["median_us"]
                h = c.get("hot") or {}
                cc = c.get("cold") or {}
                cells.append(f"{b} {bh:.2f} ({h.get('ratio', float('nan')):.3f} [{h.get('lo', float('nan')):.3f},"
                             f"{h.get('hi', float('nan')):.3f}] {h.get('verdict')}; cold {cc.get('ratio', float('nan')):.3f} "
                             f"{cc.get('verdict')})")
            smp = v["hot"].get("sampling") or {}
            print(f"  {name:<28} {v['hot']['median_us']:>7.2f} {cold:>7.2f} {v['slowcta']['slowest_task_us']:>7.2f}  "
                  f"{'; '.join(cells)}  {v.get('cold_bandwidth_fraction', float('nan')):>7.1%} "
                  f"{(v.get('ceiling') or {}).get('mix')}  n={smp.get('samples')} {smp.get('stop')} "
                  f"rej={len(smp.get('rejected') or [])}")
        if args.out:
            shutil.copy2(perf_path, args.out / f"{kname}.perf.json")
    for line in log.splitlines():
        if line.startswith("mpk: error") or line.startswith("scons: ***"):
            print(line[:200])
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
