"""GPU gates across GPUs: the catalog's validate+perf with -j1 and with -j2, in one run.

    python bench/gpu_scale.py [--out DIR] [--rounds 2] [--one KERNEL]

Copies the project to a temporary folder, compiles every kernel, warms up (one full -j2
run: the warm runner server on each GPU, the copy-bandwidth node), then alternates -j1 and
-j2 runs of `scons -k stage=perf` over the same compiled tree, each after an edit to every
kernel's reference.py (a comment: validate and perf of every kernel re-run, nothing
else). Prints each run's wall time, where each gate ran and how long it took, where the
rest of the wall time went (before the first gate, between gates on each GPU, after the
last), a no-op run's time, one kernel's validate+perf alone at -j1 and -j2 (its perf gate
shares its variants with the idle GPU), and the throughput ratio median(-j1) / median(-j2).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "site_scons"))
from mpkbuild.kernel import discover  # noqa: E402

# The catalog as the build sees it (one per specs/*.yaml), so a scaffolded kernel is measured too.
KERNELS = tuple(discover(REPO))


def copy_tree() -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="mpk-scale-"))
    for name in ("SConstruct", "site_scons", "specs", "kernels", "wiring", "gpu_profiles"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, tmp / name)
    return tmp


LAST_SPAN = {}


def scons(root: Path, log: list, *args: str) -> float:
    LAST_SPAN["start"] = time.time()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "SCons", "-Q", *args], cwd=root,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    LAST_SPAN["end"] = time.time()
    log.append(f"$ scons {' '.join(args)}  ({wall:.2f} s, exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
    return wall


def where_time_went(span: dict, gates: list[dict]) -> dict:
    """Seconds before the first gate started, after the last ended, and each GPU's busy and
    idle time between its first and last work (a perf gate that shared its variants counts
    on every GPU that timed some)."""
    work = []                                   # (gpu, start, end)
    for g in gates:
        if g.get("shared"):
            work += [(p["gpu_index"], p["started_at"], p["ended_at"]) for p in g["shared"]]
        elif g.get("started_at") and g.get("ended_at"):
            work.append((g["gpu"], g["started_at"], g["ended_at"]))
    if not work:
        return {}
    out = {"before_first_s": min(w[1] for w in work) - span["start"],
           "after_last_s": span["end"] - max(w[2] for w in work)}
    for gpu in sorted({w[0] for w in work}):
        mine = sorted((w for w in work if w[0] == gpu), key=lambda w: w[1])
        busy = sum(e - s for _, s, e in mine)
        out[f"gpu{gpu}_busy_s"] = busy
        out[f"gpu{gpu}_gaps_s"] = mine[-1][2] - mine[0][1] - busy
    return out


def phase_seconds(result: dict) -> dict:
    """A gate result's own time by phase: validate records the whole gate's, perf each
    variant's (summed here)."""
    phases: dict = dict(result.get("timings_s") or {})
    for v in (result.get("variants") or {}).values():
        for name, sec in (v.get("timings_s") or {}).items():
            phases[name] = phases.get(name, 0.0) + sec
    return phases


def gate_results(root: Path) -> list[dict]:
    rows = []
    for k in KERNELS:
        for gate in ("validate", "perf"):
            for path in sorted((root / "build" / k / "gpu").glob(f"*/{gate}.json")):
                res = json.loads(path.read_text())
                variants = res.get("variants") or {}
                rows.append({"phases": phase_seconds(res),
                             "medians_us": {f"{n}:{k}": v[k]["median_us"] for n, v in variants.items()
                                            for k in ("hot", "cold", "baseline_hot", "baseline_cold")
                                            if isinstance(v.get(k), dict)},
                             "kernel": k, "gate": gate, "verdict": res.get("verdict"),
                             "gpu": res.get("gpu_index"), "elapsed_s": res.get("elapsed_s"),
                             "shared": res.get("shared") if len(res.get("shared") or []) > 1 else None,
                             "wait_s": res.get("lease_wait_s"), "started_at": res.get("started_at"),
                             "ended_at": res.get("ended_at")})
    return rows


def edit_references(root: Path, n: int, kernels=KERNELS) -> None:
    """Touch each kernel's reference file once (argmax_fp32_v2 shares argmax_v2's)."""
    files = {yaml.safe_load((root / "specs" / f"{k}.yaml").read_text())["validate"]["reference"]
             .split(":")[0] for k in kernels}
    for rel in sorted(files):
        ref = root / rel
        ref.write_text(ref.read_text() + f"# bench edit {n}\n")


def gate_phases(runs, gate: str) -> None:
    """Each gate's own time by phase, median over the -j1 runs and over the -j2 runs, and
    (perf) how far its measured kernel times moved between them (the other GPU busy or not)."""
    print(f"\n{gate + ' gate':<14} {'phase s (-j1 / -j2)':<70} largest j2/j1-1 of the medians")
    for kernel in KERNELS:
        per = {1: [], 2: []}
        for _, jobs, _, gates, _ in runs:
            per[jobs] += [g for g in gates if g["kernel"] == kernel and g["gate"] == gate]
        if not per[1] or not per[2]:
            continue
        names = sorted({n for g in per[1] + per[2] for n in g["phases"]})
        cells = [f"{n} {statistics.median(g['phases'].get(n, 0) for g in per[1]):.2f}/"
                 f"{statistics.median(g['phases'].get(n, 0) for g in per[2]):.2f}" for n in names]
        moved = [(statistics.median(g["medians_us"][k] for g in per[2])
                  / statistics.median(g["medians_us"][k] for g in per[1]) - 1, k)
                 for k in per[1][0]["medians_us"] if all(k in g["medians_us"] for g in per[1] + per[2])]
        worst = max(moved, key=lambda m: abs(m[0]), default=None)
        print(f"{kernel:<14} {' '.join(cells):<70} "
              + (f"{worst[0]:+.1%} ({worst[1]})" if worst else "-"))


def scons_bytecode_note() -> str:
    """Every scons run pays for compiling SCons from source where it was installed without
    bytecode (pip --no-compile) and Python may not write any (PYTHONDONTWRITEBYTECODE, set on
    the GPU box): ~0.25 s of start-up per run there, which both -j1 and -j2 pay."""
    import importlib.util
    spec = importlib.util.find_spec("SCons.Node.FS")
    if spec is None or not spec.origin:
        return "SCons not importable here"
    cached = Path(importlib.util.cache_from_source(spec.origin))
    if cached.exists():
        return "SCons has bytecode"
    return ("SCons has NO bytecode (installed with --no-compile?" +
            (" PYTHONDONTWRITEBYTECODE is set" if sys.flags.dont_write_bytecode else "") +
            "): every run compiles it, start-up is ~0.25 s longer than with pip's default install")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--one", default="silu_mul_v2",
                    help="then time this one kernel's validate+perf alone, -j1 and -j2 (2 rounds; '' skips)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one more -j1 run and a no-op (scons --profile, into --out)")
    args = ap.parse_args()
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    root, log = copy_tree(), []
    t_compile = scons(root, log, "-k", "-j16", "stage=compile")
    t_warm = scons(root, log, "-k", "-j2", "stage=perf")
    walls = {1: [], 2: []}
    runs = []
    for r in range(args.rounds):
        for jobs in (1, 2):
            edit_references(root, len(runs))
            wall = scons(root, log, "-k", f"-j{jobs}", "stage=perf")
            walls[jobs].append(wall)
            gates = gate_results(root)
            runs.append((r, jobs, wall, gates, where_time_went(LAST_SPAN, gates)))
    noop = [scons(root, log, "-k", "-j2", "stage=perf") for _ in range(3)]
    one = {1: [], 2: []}                 # one kernel: the perf gate shares its variants at -j2
    for r in range(2 if args.one else 0):
        for jobs in (1, 2):
            edit_references(root, f"one {r} {jobs}", kernels=(args.one,))
            one[jobs].append(scons(root, log, "-k", f"-j{jobs}", f"kernel={args.one}", "stage=perf"))
    if args.profile and args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        edit_references(root, len(runs))
        scons(root, log, "-k", "-j1", "stage=perf", f"--profile={args.out / 'j1.prof'}")
        scons(root, log, "-k", "-j1", "stage=perf", f"--profile={args.out / 'noop.prof'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_scale.log").write_text("\n".join(log))
        (args.out / "gpu_scale.json").write_text(json.dumps(
            {"gpus": gpus, "noop_s": noop, "one_kernel": {"kernel": args.one, "j1_s": one[1], "j2_s": one[2]},
             "runs": [{"round": r, "jobs": j, "wall_s": w, "gates": g, "where": t}
                      for r, j, w, g, t in runs]}, indent=2))
    print(f"GPUs: {'; '.join(gpus)}; compile {t_compile:.1f} s, warm-up {t_warm:.1f} s; "
          f"{scons_bytecode_note()}")
    for r, jobs, wall, gates, went in runs:
        bad = [f"{g['kernel']} {g['gate']}: {g['verdict']}" for g in gates if g["verdict"] != "pass"]
        print(f"round {r} -j{jobs}: {wall:6.2f} s  ({len(gates)} gates"
              + (f"; not pass: {', '.join(bad)}" if bad else "") + ")  "
              + " ".join(f"{k[:-2]} {v:.2f}" for k, v in went.items()))
    # gpu: where the gate ran ("0+1": a perf gate whose variants a second GPU shared)
    print(f"\n{'kernel':<14} {'gate':<9} " + " ".join(f"r{r}-j{j} gpu/s/wait".rjust(22) for r, j, _, _, _ in runs))
    for i, g0 in enumerate(runs[0][3]):
        cells = []
        for _, _, _, gates, _ in runs:
            g = gates[i] if i < len(gates) else {}
            where = "+".join(str(p["gpu_index"]) for p in g["shared"]) if g.get("shared") else g.get("gpu")
            cells.append(f"{where}/{g.get('elapsed_s', 0) or 0:.2f}/{g.get('wait_s') or 0:.2f}".rjust(22))
        print(f"{g0['kernel']:<14} {g0['gate']:<9} " + " ".join(cells))
    gate_phases(runs, "validate")
    gate_phases(runs, "perf")
    failed = any(g["verdict"] != "pass" for g in runs[-1][3])
    print(f"\nno-op -j2: {', '.join(f'{t:.2f}' for t in noop)} s"
          + (" (not a no-op: a failed gate runs again each time)" if failed else ""))
    if one[1]:
        print(f"\n{args.one} alone (validate + perf): -j1 {', '.join(f'{t:.2f}' for t in one[1])} s, "
              f"-j2 {', '.join(f'{t:.2f}' for t in one[2])} s")
    m1, m2 = statistics.median(walls[1]), statistics.median(walls[2])
    print(f"\nmedian -j1 {m1:.2f} s, median -j2 {m2:.2f} s: throughput ratio -j2/-j1 = {m1 / m2:.2f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
