"""What a worker's composition does to one variant's task (issue 59 item 1): the runtime
gate's megakernel of one kernel built four ways -- the production worker and the minimal
one, each holding every variant of the spec or only the one studied -- with the evidence
from each binary: the worker entry's registers, stack and spills (ptxas), its machine code's size
(instructions of the worker entry, from the cubin) and the code itself under --out for diffs,
the nvcc and host compiler that built it. With --run (on a GPU) the runtime gate's runner
then times the variant against its incumbent in each library, one after another on the
same GPU: ours' makespan and ours / the incumbent, with the A/A floor.

    python bench/worker_evidence.py --kernel rmsnorm_v2 --variant decode_r1_h4096 \
        --mpk-root ../shared/mirage/mpk --out /tmp/evidence [--run] [--probes N] [--elsewhere DIR]

--probes N adds, in each worker, a composition holding every variant and N more (the tune
space's nearest configurations): the controlled experiment for "a spec grown by candidate
configurations moves the variants it already had".

--elsewhere DIR names an --out folder written by an earlier run, on another machine (its
libraries built by that machine's nvcc and host compiler) or from another source tree: each
of its libraries is timed too, in turn with the one built here, and the two workers' machine
code is compared byte for byte -- the controlled experiment for "the verdict moved when the
build moved machines", or for one body against another in the same composition (a run
from another source tree is timed with that tree's own graphs, where the tree is here).
"""
from __future__ import annotations

import argparse
import json
import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "site_scons"))

from mpkbuild.stages import load_kernel  # noqa: E402
from mpkbuild.stages.runtime import build_in, kernel_with  # noqa: E402
from mpkbuild.stages.runtime import megakernel as mk  # noqa: E402
from mpkbuild.util.nvcc_steps import cubin_functions  # noqa: E402
from mpkbuild.util.toolchain import toolchain_fact  # noqa: E402


def compositions(k, variant: str, probes: int = 0) -> dict:
    """name -> the kernel as that megakernel's source is made from."""
    data = k.base.data
    every = data["codegen"]["variants"]
    sets = [("every variant", every), (f"{variant} only", {variant: every[variant]})]
    if probes:
        sets.insert(1, (f"every variant + {probes} probes", {**every, **probe_variants(data, probes)}))
    runtime = {**data["runtime"], "blocks": [], "thresholds": []}
    return {f"{worker} worker, {which}": kernel_with(k, variants, {**runtime, "composition": worker})
            for worker in ("production", "minimal") for which, variants in sets}


def probe_variants(data: dict, n: int) -> dict:
    """n more variants, the tune space's nearest configurations of each tuned variant taken in
    turn: a spec grown by candidates, as RESULTS section 16's probe megakernel of 40 silu_mul
    configurations was (its decode tasks then ran 3-4x slower than in the catalog's)."""
    from mpkbuild.stages.tune.space import space
    variants = data["codegen"]["variants"]
    pools = [(v, [c for c in s["candidates"] if not c.current]) for v, s in space(data).items()]
    seen = {json.dumps(b, sort_keys=True) for b in variants.values()}
    out: dict = {}
    while len(out) < n and any(pool for _, pool in pools):
        for v, pool in pools:
            if pool and len(out) < n:
                binding = {**variants[v], **pool.pop(0).values}
                key = json.dumps(binding, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out[f"probe{len(out)}_{v}"] = binding
    return out


def build(k, out: Path, checkout) -> dict:
    """The megakernel of k in `out`, compiled; its worker's figures and machine code size."""
    ok, text, took, lib = build_in(k, out, checkout)
    if not ok:
        raise SystemExit(f"{out}: nvcc failed, see {out / 'compile.log'}")
    # the worker entry's machine code, from the cubin the split build keeps (nvcc-steps/)
    code = next((c for n, c in cubin_functions(out / "nvcc-steps" / "megakernel.cubin").items()
                 if "worker_kernel" in n), b"")
    (out / "worker.text").write_bytes(code)          # for cuobjdump/nvdisasm, or a byte diff
    return {**mk.worker_facts(text), "compile_s": round(took, 1), "library": str(lib.relative_to(out.parent)),
            "sass_instructions": len(code) // 16, "worker_sha256": hashlib.sha256(code).hexdigest()[:16]}


def run(k, lib: str, checkout_root: Path, variant: str) -> dict:
    """The runtime gate's runner on one library, for the variant's graphs only."""
    from mpkbuild.runners import runtime as runner
    from mpkbuild.stages.runtime import judge
    payload = mk.job_payload(k, checkout_root=checkout_root)
    # the job's graphs are the library's, index for index; only the studied variant's run
    res = runner.main({"root": str(k.root), "library": lib, "kernel": k.name, "runtime": payload,
                       "only": [variant]})
    r = (res.get("variants") or {}).get(variant) or {}
    h = r.get("head_to_head")
    if res["verdict"] != "pass" or not h:
        return {"verdict": res["verdict"], "message": res.get("message", "")[:300]}
    judge.figures(h)
    (inc, x), *_ = h["incumbents"].items()
    c = x["vs"]["makespan"]
    return {"verdict": "pass", "ours_us": h["ours_figures"]["makespan"], "incumbent": inc,
            "vs": [round(c["ratio"], 4), round(c["lo"], 4), round(c["hi"], 4)], "floor": h["floor"]["makespan"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--mpk-root", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--run", action="store_true", help="time each library on this GPU")
    ap.add_argument("--composition", action="append", help="build only these (e.g. 'production worker, every variant')")
    ap.add_argument("--elsewhere", type=Path, help="an --out folder built on another machine, timed beside")
    ap.add_argument("--probes", type=int, default=0,
                    help="also build each worker with every variant and this many more (tune-space neighbours)")
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.elsewhere = args.elsewhere and args.elsewhere.resolve()
    there = json.loads((args.elsewhere / "evidence.json").read_text()) if args.elsewhere else None
    checkout = mk.Checkout.find(args.mpk_root.resolve())
    k = load_kernel(REPO, args.kernel, write_cache=False)
    # a run from another source tree is timed with its own tree's job (its spec's graphs)
    theirs = (compositions(load_kernel(Path(there["repo"]), args.kernel, write_cache=False), args.variant, args.probes)
              if there and there.get("repo") and Path(there["repo"]).is_dir() else None)
    rows = {}
    for i, (name, kk) in enumerate(compositions(k, args.variant, args.probes).items()):
        if args.composition and name not in args.composition:
            continue
        rows[name] = build(kk, args.out / f"c{i}", checkout)
        sides = [(name, kk)]
        other = there and there["rows"].get(name)
        if other:
            label = f"{name} ({args.elsewhere.name})"
            rows[label] = {**other, "library": str(args.elsewhere / other["library"])}
            rows[name]["same_machine_code"] = other["worker_sha256"] == rows[name]["worker_sha256"]
            sides.append((label, theirs[name] if theirs else kk))
        rounds = (2 if other else 1) if args.run else 0       # A B A B: drift shows
        for _ in range(rounds):
            for key, spec_of in sides:
                lib = rows[key]["library"]
                lib = lib if Path(lib).is_absolute() else str(args.out / lib)
                rows[key].setdefault("runs", []).append(run(spec_of, lib, checkout.root, args.variant))
    (args.out / "evidence.json").write_text(json.dumps({"toolchain": toolchain_fact(), "repo": str(REPO), "rows": rows,
                                                         "elsewhere": there and there["toolchain"]}, indent=1))
    print(f"{args.kernel} {args.variant}; here: {toolchain_fact()}"
          + (f"; elsewhere: {there['toolchain']}" if there else ""))
    print("| worker | registers | stack B | spills B | worker SASS instructions | ours µs [95%] | ours / incumbent [95%] | A/A floor |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, r, x in ((n, r, x) for n, r in rows.items() for x in r.get("runs") or [{}]):
        us = x.get("ours_us")
        print(f"| {name} | {r.get('registers')} | {r.get('stack_bytes')} | "
              f"{(r.get('spill_stores') or 0) + (r.get('spill_loads') or 0)} | {r['sass_instructions']} | "
              + (f"{us['median']:.2f} [{us['lo']:.2f}, {us['hi']:.2f}] | {x['vs'][0]:.3f} [{x['vs'][1]:.3f}, "
                 f"{x['vs'][2]:.3f}] {x['incumbent']} | ±{100 * x['floor']:.1f}% |" if us else
                 f"{x.get('message', 'not run') if x else 'not run'} | | |"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
