"""Edit-to-verdict time and per-variant perf of rmsnorm_v2, in one run on the GPU box.

    python bench/rmsnorm_gates.py [--out DIR] [--edits N] [--mpk-root PATH] [--runtime-only]

Copies the project to a temporary folder, builds everything through review, then makes a
kernel-body edit (a comment in the rendered body, so nvcc really re-runs) and times
`scons stage=validate` (generate + compile + validate: the edit-to-verdict path) and then
`scons stage=perf`, split per stage. Prints the per-variant table from perf.json last:
graph-timed hot/cold us, slowCTA us, torch's us timed the same way, achieved bandwidth as
a fraction of the GPU's measured copy bandwidth. With --mpk-root (an MPK checkout, e.g. the
carried .mirage/mpk on the box) also the runtime gate: its first run (megakernel render,
nvcc, the run apart) and, per edit, a second body edit timed to the runtime verdict, then
per variant the in-runtime slowest and median task beside the harness's slowCTA.
With --runtime-only (and --mpk-root) only the runtime path: its first build, then each
body edit to the in-runtime verdict, with the gate's own time taken apart (phases_s).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
K = "rmsnorm_v2"
LABEL = re.compile(r"^(spec|generate|compile|validate|perf|review|bandwidth|megakernel|"
                   r"megakernel-compile|runtime)\s")


def scons(root: Path, *args: str) -> tuple[float, list[tuple[float, str]], str]:
    """Run scons; return wall seconds, (seconds since start, action line) and stdout."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "SCons", "-Q", *args], cwd=root, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stamps, out = [], []
    for line in proc.stdout:
        out.append(line)
        if LABEL.match(line):
            stamps.append((time.perf_counter() - start, line.strip()))
    proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode:   # a failing gate still has a result to show; say so and go on
        print(f"note: scons {' '.join(args)} exited {proc.returncode} (a gate did not pass)")
    return wall, stamps, "".join(out)


def split(stamps, wall) -> dict:
    """Seconds per stage: from an action's line to the next line (or the end)."""
    per = {}
    for i, (t, label) in enumerate(stamps):
        end = stamps[i + 1][0] if i + 1 < len(stamps) else wall
        stage = label.split()[0]
        per[stage] = per.get(stage, 0.0) + end - t
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for logs and results")
    ap.add_argument("--edits", type=int, default=3, help="body edits to time (median reported)")
    ap.add_argument("--spec-edit", action="append", default=[], metavar="OLD=>NEW",
                    help="text replacement in the copied spec (to compare levers in one run)")
    ap.add_argument("--mpk-root", type=Path, default=None,
                    help="an MPK checkout: also time the runtime gate and its edit-to-verdict")
    ap.add_argument("--runtime-only", action="store_true",
                    help="with --mpk-root: time only the runtime path (no review, validate or perf)")
    args = ap.parse_args()
    if args.runtime_only and not args.mpk_root:
        raise SystemExit("--runtime-only needs --mpk-root")
    tmp = Path(tempfile.mkdtemp(prefix="mpk-bench-"))
    for name in ("SConstruct", "site_scons", "specs", "kernels", "wiring"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "SConstruct", tmp / "SConstruct")
    spec = tmp / "specs" / f"{K}.yaml"
    for edit in args.spec_edit:
        old, new = edit.split("=>", 1)
        if old not in spec.read_text():
            raise SystemExit(f"--spec-edit: {old!r} is not in the spec")
        spec.write_text(spec.read_text().replace(old, new))
    wall_full, log_full = 0.0, ""
    if not args.runtime_only:
        wall_full, _, log_full = scons(tmp, "-k", "-j4", "stage=review")
    body = tmp / "kernels" / K / f"{K}.cuh.j2"
    runtime_args = (f"kernel={K}", "stage=runtime", f"mpk_root={args.mpk_root.resolve()}") \
        if args.mpk_root else None
    runtime_runs, log_rt = [], ""

    def runtime_run(what: str) -> None:
        """One scons call to the runtime verdict: its wall time, split by action, and the
        gate's own phases (runtime.json phases_s)."""
        nonlocal log_rt
        wall_r, stamps_r, log_r = scons(tmp, *runtime_args)
        gates = list((tmp / "build" / K / "gpu").glob("*/runtime.json"))
        result = json.loads(gates[0].read_text()) if gates else {}
        runtime_runs.append({"what": what, "wall_s": wall_r, **split(stamps_r, wall_r),
                             "phases": result.get("phases_s", {}), "elapsed_run_s": result.get("elapsed_run_s")})
        log_rt += log_r

    if runtime_args:
        runtime_run("first")
    rows = []
    if args.runtime_only:
        for edit in range(args.edits):
            body.write_text(body.read_text() + f"// bench runtime edit {edit}\n")
            runtime_run(f"edit {edit}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "bench.log").write_text(log_rt)
            (args.out / "runtime_runs.json").write_text(json.dumps(runtime_runs, indent=1))
        gpu_dir = next((tmp / "build" / K / "gpu").iterdir())
        print_runtime(runtime_runs, gpu_dir, {"variants": {}})
        shutil.rmtree(tmp, ignore_errors=True)
        return
    for edit in range(args.edits):
        body.write_text(body.read_text() + f"// bench edit {edit}\n")
        wall_v, stamps_v, log_v = scons(tmp, f"kernel={K}", "stage=validate")
        wall_p, stamps_p, log_p = scons(tmp, "-k", f"kernel={K}", "stage=perf")
        rows.append({"edit_to_validate_s": wall_v, **{f"{k}_s": v for k, v in split(stamps_v, wall_v).items()},
                     "perf_s": split(stamps_p, wall_p).get("perf", 0.0), "perf_wall_s": wall_p})
        if runtime_args:    # an edit of its own, so the runtime call does the whole path
            body.write_text(body.read_text() + f"// bench runtime edit {edit}\n")
            runtime_run(f"edit {edit}")
    gpu_dirs = list((tmp / "build" / K / "gpu").iterdir())
    perf = json.loads((gpu_dirs[0] / "perf.json").read_text())
    validate = json.loads((gpu_dirs[0] / "validate.json").read_text())
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(gpu_dirs[0] / "perf.json", args.out / "perf.json")
        shutil.copy2(gpu_dirs[0] / "validate.json", args.out / "validate.json")
        shutil.copy2(tmp / "build" / K / "review.md", args.out / "review.md")
        (args.out / "bench.log").write_text(log_full + "".join(log_v) + log_p + log_rt)
        if runtime_args and (gpu_dirs[0] / "runtime.json").exists():
            shutil.copy2(gpu_dirs[0] / "runtime.json", args.out / "runtime.json")

    print(f"GPU: {perf['device']['name']} (torch {perf['device']['torch']}), "
          f"copy bandwidth {perf['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; full first build {wall_full:.1f} s")
    print(f"validate {validate['verdict']}, perf {perf['verdict']}: {perf['message']}")
    print("\nbody edit -> verdict (s): scons stage=validate = generate + compile(sm_90a) + validate "
          "(+ scons start-up); then stage=perf")
    print(f"{'edit':>4} {'to validate':>11} {'generate':>8} {'compile':>8} {'validate':>8} {'perf':>7}")
    for i, r in enumerate(rows):
        print(f"{i:>4} {r['edit_to_validate_s']:>11.2f} {r.get('generate_s', 0):>8.2f} "
              f"{r.get('compile_s', 0):>8.2f} {r.get('validate_s', 0):>8.2f} {r['perf_s']:>7.2f}")
    med = sorted(r["edit_to_validate_s"] for r in rows)[len(rows) // 2]
    print(f"median edit -> validate verdict: {med:.2f} s")
    over = sorted(r["edit_to_validate_s"] - r.get("compile_s", 0.0) for r in rows)[len(rows) // 2]
    print(f"median edit -> verdict beyond nvcc's compile: {over:.2f} s (issue 6 target: <= 1.5 s, "
          "warm runner; the compile figure runs from the compile line to the validate line)")
    print(f"\n{'variant':<20} {'hot us':>7} {'cold us':>7} {'slowCTA':>7} {'torch hot':>9} "
          f"{'torch cold':>10} {'vs torch':>8} {'BW hot':>6} {'BW cold':>7}")
    for name, v in perf["variants"].items():
        print(f"{name:<20} {v['hot']['median_us']:>7.2f} {v.get('cold', {}).get('median_us', float('nan')):>7.2f} "
              f"{v['slowcta']['slowest_task_us']:>7.2f} {v['baseline_hot']['median_us']:>9.2f} "
              f"{v.get('baseline_cold', {}).get('median_us', float('nan')):>10.2f} "
              f"{v['vs_baseline_hot']:>7.2f}x {v['hot_bandwidth_fraction']:>6.0%} "
              f"{v.get('cold_bandwidth_fraction', float('nan')):>7.0%}")
    if runtime_args:
        print_runtime(runtime_runs, gpu_dirs[0], perf)
    shutil.rmtree(tmp, ignore_errors=True)


def print_runtime(runs: list[dict], gpu_dir: Path, perf: dict) -> None:
    """The runtime gate's wall time (render, nvcc and the run apart) per call, then per
    variant the in-runtime task spans beside the harness's slowCTA."""
    print("\nruntime gate (s): the first call, then a body edit -> runtime verdict per edit")
    print(f"{'call':>8} {'wall':>7} {'megakernel':>10} {'nvcc':>7} {'run':>7}")
    for r in runs:
        print(f"{r['what']:>8} {r['wall_s']:>7.2f} {r.get('megakernel', 0):>10.2f} "
              f"{r.get('megakernel-compile', 0):>7.2f} {r.get('runtime', 0):>7.2f}")
        if r.get("phases"):
            print(f"{'':>8} the gate's process ran {r.get('elapsed_run_s')} s: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items()))
    path = gpu_dir / "runtime.json"
    if not path.exists():
        print("no runtime.json: the gate did not finish")
        return
    rt = json.loads(path.read_text())
    print(f"runtime {rt['verdict']}: {rt.get('message', '')[:300]}")
    edits = sorted(r["wall_s"] for r in runs if r["what"] != "first")
    if edits:
        print(f"median body edit -> in-runtime verdict: {edits[len(edits) // 2]:.2f} s (issue 40 target: <= 10 s)")
    print(f"\n{'graph':<34} {'tasks':>6} {'runtime slowest us':>18} {'median us':>9} {'harness slowCTA us':>18}"
          f"  ours / incumbent (makespan, 95%)")
    for name, g in rt.get("variants", {}).items():
        spans = g.get("spans") or {}
        harness = (perf["variants"].get(name) or {}).get("slowcta", {}).get("slowest_task_us")
        vs = ""
        for inc, x in ((g.get("head_to_head") or {}).get("incumbents") or {}).items():
            c = (x.get("vs") or {}).get("makespan") or {}
            if c.get("ratio") is not None:
                vs += f"  {inc} {c['ratio']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}] {c['verdict']}"
        print(f"{name:<34} {g.get('tasks', 0):>6} {spans.get('slowest_task_us', float('nan')):>18.2f} "
              f"{spans.get('median_us', float('nan')):>9.2f} "
              f"{harness if harness is not None else float('nan'):>18.2f}{vs}")


if __name__ == "__main__":
    main()
