"""What slows a gate's own phases when another GPU of the host is busy, and by how much.

    python bench/beside_other_gpu.py [--reps 3] [--gates silu_mul_v2:perf,rmsnorm_v2:validate]
                                     [--modes none,churn,cpu,none,churn] [--out DIR]

Needs two GPUs. Copies the project, compiles it and runs one `-j2 stage=perf` build (for
the gates' job files), stops the warm servers, then for each mode runs each listed gate's
runner body `--reps` times in one fresh process on GPU 0 while GPU 1 has:
- none: nothing;
- churn: processes forked one after another, each making a CUDA context, allocating
  256 MB and exiting (what spares starting and gates ending do beside a -j2 build);
- cpu: a pure-Python loop (CPU load with no CUDA call).
The first rep in a process pays the gate's first CUDA calls (lazy kernel loading, cuBLAS);
the later ones do not. Prints each rep's wall time and phases.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_scale import copy_tree, phase_seconds  # noqa: E402

LEAD_S = 8.0                # the background runs this long (torch import included) before the gate


def gate_body(job_file: str, reps: int) -> None:
    """Child: one gate's runner body, `reps` times in this process, one JSON line each."""
    import importlib
    from mpkbuild.runners import gpuwait
    job = json.loads(Path(job_file).read_text())
    job.pop("share", None)
    job["result_file"] = f"/tmp/beside-{os.getpid()}.json"
    runner = importlib.import_module(f"mpkbuild.runners.{job['gate']}")
    gpuwait.prepare_context()
    import torch
    torch.empty(1, device="cuda")
    for rep in range(reps):
        start = time.perf_counter()
        res = runner.main(job)
        print(json.dumps({"rep": rep, "wall_s": time.perf_counter() - start,
                          "verdict": res.get("verdict"), "phases": phase_seconds(res)}), flush=True)
    os._exit(0)


def background(mode: str, seconds: float) -> None:
    """Child: load on this process's GPU until `seconds` have passed."""
    end = time.time() + seconds
    if mode == "cpu":
        while time.time() < end:
            sum(i * i for i in range(100_000))
        return
    import torch                      # imported once; each forked child makes its own context
    while time.time() < end:
        pid = os.fork()
        if pid == 0:
            torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            os._exit(0)
        os.waitpid(pid, 0)


def child(args: list[str], gpu: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True,
                            env={**env, "CUDA_VISIBLE_DEVICES": str(gpu)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gates", default="silu_mul_v2:perf,rmsnorm_v2:validate")
    ap.add_argument("--modes", default="none,churn,cpu,none,churn")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--gate-body", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--background", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gate_body:
        return gate_body(args.gate_body[0], int(args.gate_body[1]))
    if args.background:
        return background(args.background[0], float(args.background[1]))

    root = copy_tree()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root / "site_scons")] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    for stage, jobs in (("compile", "-j16"), ("perf", "-j2")):
        subprocess.run([sys.executable, "-m", "SCons", "-Q", "-k", jobs, f"stage={stage}"], cwd=root,
                       env=env, capture_output=True, check=False)
    subprocess.run(["pkill", "-f", "mpkbuild.warm"], check=False)       # no spares beside us
    time.sleep(1.0)
    rows = []
    for mode in args.modes.split(","):
        for gate in args.gates.split(","):
            kernel, name = gate.split(":")
            (job_file,) = sorted((root / "build" / kernel / "gpu").glob(f"*/.{name}.job.json"))[:1]
            bg = None
            if mode != "none":
                bg = child(["--background", mode, "600"], 1, env)
                time.sleep(LEAD_S)
            fg = child(["--gate-body", str(job_file), str(args.reps)], 0, env)
            out, _ = fg.communicate()
            if bg:
                bg.kill()
                bg.wait()
            for line in out.splitlines():
                if line.startswith("{"):
                    rows.append({"mode": mode, "gate": gate, **json.loads(line)})
    print(f"{'beside (GPU 1)':<15} {'gate (GPU 0)':<22} rep  wall s  phases s")
    for r in rows:
        phases = " ".join(f"{k} {v:.3f}" for k, v in sorted(r["phases"].items()) if v >= 0.0005)
        print(f"{r['mode']:<15} {r['gate']:<22} {r['rep']:>3} {r['wall_s']:7.3f}  {phases}  ({r['verdict']})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "beside_other_gpu.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
