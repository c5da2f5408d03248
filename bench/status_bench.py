"""Issue 3's performance numbers: `scons status` and a no-op build against plain SCons.

    python bench/status_bench.py [--sizes 10,50,200] [--runs 5] [--corpus-size 10]
                                 [--results bench/RESULTS.md | --no-results] [--out DIR]

For each N it makes, in a temporary folder, a synthetic tree of N kernels (specs made from
specs/rmsnorm_v2.yaml: renamed, no `wiring:` section, two small variants, a trivial task
body kernels/<K>/<K>.cuh.j2 and a copy of the reference) and builds it fully once
(`scons -j2 kernel=all stage=review`, GPU stages by the stand-in executor
tests/fakes/fake_gpu.py). Beside it, a plain-SCons tree whose SConstruct declares the SAME
nodes — one Command per node of `mpkbuild.model.graph.build(...)` on the synthetic tree, with the
same targets, file sources, facts as Value nodes, side effects, AlwaysBuild and default
alias — whose actions are trivial Python functions (each target gets the concatenation of
the sources' bytes). The twin is lean and set up as ours is: no default tools
(DefaultEnvironment and Environment), implicit cache off, the content decider, and one
shared Action with no per-Command construction variables or varlist. Then, interleaved, `--runs` times: plain no-op `scons -Q`, ours no-op
`scons -Q kernel=all stage=review executor=...`, ours `scons -Q status executor=...`.
Each figure is the median wall time of a fresh process.

Raw output goes to --out DIR (default: a new temporary folder, printed at the end and kept):
raw.json (every run's wall time per command and N, the tree shapes, the load average before
and after each N, every dry-run row with its missing/extra actions), summary.md (the section
below), and dryrun/NN-<edit>.txt (the stdout of our `-n`, of the real build and of the twin's
`-n` for each edit), so a dry-run miss can be read afterwards.

Dry-run accuracy: over an edit corpus on the smallest tree, the actions our `scons -n`
lists against the actions the real build then executes (and the stand-in GPU's runs). For
plain SCons's `scons -n` (our tool intercepts -n, so it cannot be run as-is) the count is
derived: the executed actions that have a *direct* input the edit changed on disk (a
source file or a fact, i.e. a Value node) — what SCons itself can see before running
anything, since it cannot know that a regenerated file will change.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
EXECUTOR = "executor=fake_gpu:FakeGpuExecutor"
TEMPLATE_KERNEL = "rmsnorm_v2"
COPIED = ("SConstruct", "site_scons", "pyproject.toml")

TRIVIAL_BODY = """\
// {{ kernel }} task body (synthetic bench kernel): copies its row, nothing more.
#pragma once
#include <cuda_bf16.h>

template <int HIDDEN, int RPT>
__device__ __forceinline__ void {{ kernel }}_task(const __nv_bfloat16* input,
                                                 const __nv_bfloat16* weight,
                                                 __nv_bfloat16* output,
                                                 int task_index, char* smem) {
  (void)weight; (void)task_index; (void)smem;
  for (int i = threadIdx.x; i < HIDDEN; i += {{ kernel }}_spec::THREADS) output[i] = input[i];
}
"""


def kernel_name(i: int) -> str:
    return f"bench{i:03d}"


# ---------------------------------------------------------------- the synthetic tree
def make_tree(dest: Path, n: int) -> list[str]:
    dest.mkdir(parents=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    (dest / "specs").mkdir()
    base = yaml.safe_load((REPO / "specs" / f"{TEMPLATE_KERNEL}.yaml").read_text())
    base.pop("wiring", None)
    reference = (REPO / "kernels" / TEMPLATE_KERNEL / "reference.py").read_text()
    names = []
    for i in range(n):
        k = kernel_name(i)
        names.append(k)
        spec = json.loads(json.dumps(base))
        spec["kernel"] = k
        spec["description"] = f"synthetic bench kernel {i}: copies a row"
        cg = spec["codegen"]
        cg["body"] = f"kernels/{k}/{k}.cuh.j2"
        cg["variants"] = {"decode_r1_h1024": {"rows": 1, "hidden": 1024, "rpt": 1},
                          "decode_r8_h2048": {"rows": 8, "hidden": 2048, "rpt": 1}}
        spec["validate"]["reference"] = f"kernels/{k}/reference.py:rmsnorm_reference"
        spec["perf"]["baseline"] = f"kernels/{k}/reference.py:torch_rms_norm"
        for extra in spec["perf"].get("baselines", []):     # torch.compile etc.: this kernel's file
            extra["function"] = f"kernels/{k}/reference.py:" + extra["function"].rsplit(":", 1)[1]
        spec.pop("tune", None)       # the graph the status figures were first measured on
        spec["perf"]["thresholds"] = [{"variants": "decode_*", "max_time_vs_baseline": 1.0}]
        spec["runtime"]["thresholds"] = [t for t in spec["runtime"]["thresholds"] if t["variants"] == "*"]
        text = (f"# {k}: synthetic kernel for bench/status_bench.py (from {TEMPLATE_KERNEL}.yaml)\n"
                + yaml.safe_dump(spec, sort_keys=False, width=100))
        (dest / "specs" / f"{k}.yaml").write_text(text)
        kdir = dest / "kernels" / k
        kdir.mkdir(parents=True)
        (kdir / f"{k}.cuh.j2").write_text(TRIVIAL_BODY)
        (kdir / "reference.py").write_text(reference)
    return names


def scons_env(extra: dict | None = None) -> dict:
    # PYTHONDONTWRITEBYTECODE off: the tree's site_scons gets its __pycache__ as on a user's
    # machine (SCons itself is installed with its .pyc files); otherwise every run of ours
    # compiles the whole mpkbuild package from source and the twin compiles nothing
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAKE_GPU", "MPK_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.update(extra or {})
    return env


def scons(cwd: Path, *args: str, env: dict | None = None, check: bool = True,
          timeout: int = 3600) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [sys.executable, "-m", "SCons", "-Q", *args]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env or scons_env(), capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds (user + system) of the process and its children: steadier than wall time
    # on a loaded machine, recorded beside it in raw.json
    proc.cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} in {cwd} exited {proc.returncode}\n"
                           f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return wall, proc


GRAPH_DUMP = r"""
import json, sys
from pathlib import Path
from mpkbuild import stages
from mpkbuild.stages import wire as wirestage
from mpkbuild.model.kernel import discover
from fake_gpu import FakeGpuExecutor
root = Path.cwd()
names = discover(root)
ks = [stages.load_kernel(root, n) for n in names]
g = stages.build_graph(root, ks, FakeGpuExecutor().fingerprint(), wirestage.WireRequest(None, False, False), True)
json.dump({"gpu_key": g.gpu_key, "default": g.request(names, "review", True),
           "nodes": [{"label": n.label, "kind": n.kind, "targets": n.targets, "sources": n.sources,
                      "facts": n.facts, "side_effects": n.side_effects, "always": n.always,
                      "n_opts": len(n.opts)} for n in g.nodes]}, sys.stdout)
"""


def dump_graph(tree: Path, extra: dict | None = None) -> dict:
    """The graph model of the tree, as the tool builds it (extra: environment, e.g. PATH)."""
    env = scons_env({**(extra or {}), "PYTHONPATH": os.pathsep.join([str(tree / "site_scons"), str(FAKES)])})
    out = subprocess.run([sys.executable, "-c", GRAPH_DUMP], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


STAND_IN_NVCC = r"""#!{python}
# bench/status_bench.py --stand-in-nvcc: the first build of a big synthetic tree without
# running the real nvcc per kernel (hours on a small machine). `--version` is the real
# nvcc's, so the toolchain fact is the same as a real build's; a compile writes a library of
# a real one's size (~1 MB, its bytes derived from the harness) and prints ptxas's resource
# lines for the synthetic kernels' two variants.
import hashlib, os, re, sys
REAL = {real!r}
args = sys.argv[1:]
if "--version" in args:
    os.execv(REAL, [REAL, *args])
out, harness = args[args.index("-o") + 1], args[-1]
arch = re.search(r"code=(sm_\w+)", " ".join(args)).group(1)
kernel = harness.replace(os.sep, "/").split("/")[-3]
seed = hashlib.sha256(open(harness, "rb").read() + arch.encode()).digest()
with open(out, "wb") as fh:
    fh.write((seed * (997832 // len(seed) + 1))[:997832])
print("ptxas info    : 0 bytes gmem")
for v in ("decode_r8_h2048", "decode_r1_h1024"):
    name = f"{{kernel}}__{{v}}"
    mangled = f"_Z{{len(name)}}{{name}}PK13__nv_bfloat16S1_PS_Py"
    print(f"ptxas info    : Compiling entry function '{{mangled}}' for '{{arch}}'")
    print(f"ptxas info    : Function properties for {{mangled}}")
    print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    print("ptxas info    : Used 14 registers, used 1 barriers")
"""


def stand_in_nvcc(folder: Path) -> dict:
    """A folder with the stand-in nvcc; returns the environment that puts it first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvcc"
    tool.write_text(STAND_IN_NVCC.format(python=sys.executable, real=shutil.which("nvcc")))
    tool.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


# ---------------------------------------------------------------- the plain-SCons twin
PLAIN_SCONSTRUCT = '''\
# Plain SCons twin of a synthetic mpkbuild tree (bench/status_bench.py): the same nodes,
# targets, sources, facts (Value nodes), side effects and default alias; trivial actions.
# Lean, and set up as ours is (SConstruct + site_tools/mpk.py): no default tools, implicit
# cache off, content decider, one shared Action with no construction variables or varlist
# per Command (the printed label is looked up by the first target, as ours does).
import json
SetOption("implicit_cache", 0)
DefaultEnvironment(tools=[])
env = Environment(tools=[])
env.Decider("content")
LABELS = {}


def concat(target, source, env):
    data = b"".join(s.get_contents() for s in source)
    for t in target:
        with open(t.abspath, "wb") as fh:
            fh.write(data + t.path.encode())
    return 0


ACT = Action(concat, strfunction=lambda t, s, e: LABELS[str(t[0])])
with open("graph.json") as fh:
    graph = json.load(fh)
for n in graph["nodes"]:
    srcs = [env.File(s) for s in n["sources"]] + [env.Value(f) for f in n["facts"]]
    tgts = env.Command(n["targets"], srcs, ACT)
    LABELS[str(tgts[0])] = n["label"]
    for side in n["side_effects"]:
        env.SideEffect(side, tgts)
    if n["always"]:
        env.AlwaysBuild(tgts)
Default(env.Alias("all", [env.File(t) for t in graph["default"]]))
'''


def make_plain(dest: Path, graph: dict) -> dict:
    """Write the twin: leaf source files (small, the same paths) and its SConstruct."""
    dest.mkdir(parents=True)
    produced = {t for n in graph["nodes"] for t in n["targets"]}
    leaves = sorted({s for n in graph["nodes"] for s in n["sources"]} - produced)
    for rel in leaves:
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"leaf {rel}\n")
    (dest / "graph.json").write_text(json.dumps(graph))
    (dest / "SConstruct").write_text(PLAIN_SCONSTRUCT)
    return {"nodes": len(graph["nodes"]),
            "targets": len(produced),
            "leaves": len(leaves),
            "facts": len({f for n in graph["nodes"] for f in n["facts"]}),
            "edges": sum(len(n["sources"]) + len(n["facts"]) for n in graph["nodes"])}


# ---------------------------------------------------------------- timing
def median_runs(trees: dict, runs: int) -> dict:
    """Interleaved: plain no-op, ours no-op, ours status; `runs` rounds; wall seconds."""
    times = {"plain": [], "noop": [], "status": [], "plain_md0": [], "noop_md0": [],
             "cpu": {"plain": [], "noop": [], "status": []}}
    for _ in range(runs):
        w, p = scons(trees["plain"])
        assert "up to date" in p.stdout, p.stdout[-500:]
        times["plain"].append(w)
        times["cpu"]["plain"].append(p.cpu)
        w, p = scons(trees["ours"], "kernel=all", "stage=review", EXECUTOR)
        assert "up to date" in p.stdout and "\nspec " not in p.stdout, p.stdout[-500:]
        times["noop"].append(w)
        times["cpu"]["noop"].append(p.cpu)
        w, p = scons(trees["ours"], "status", EXECUTOR)
        assert "everything is fresh" in p.stdout, p.stdout[-800:]
        times["status"].append(w)
        times["cpu"]["status"].append(p.cpu)
        # --max-drift=0: SCons trusts a file's recorded content signature while its mtime is
        # unchanged, as it does by default for files older than two days. Our outputs are
        # real (a ~1 MB .so per arch); the twin's are tiny: this pair shows the difference
        # that re-hashing freshly built files makes.
        times["plain_md0"].append(scons(trees["plain"], "--max-drift=0")[0])
        times["noop_md0"].append(scons(trees["ours"], "--max-drift=0", "kernel=all", "stage=review",
                                       EXECUTOR)[0])
    return times


def bare_startup(folder: Path, runs: int) -> float:
    """`scons -Q` on an empty SConstruct: the interpreter plus SCons's own start-up."""
    folder.mkdir()
    (folder / "SConstruct").write_text("Default(Alias(\"bare\", []))\n")
    return statistics.median(scons(folder)[0] for _ in range(runs))


# ---------------------------------------------------------------- dry-run accuracy
def _edit(rel: str, old: str, new: str):
    def apply(tree: Path) -> dict:
        p = tree / rel
        text = p.read_text()
        assert old in text, f"{old!r} not in {rel}"
        p.write_text(text.replace(old, new, 1))
        return {}
    return apply


def _append(rel: str, line: str):
    def apply(tree: Path) -> dict:
        p = tree / rel
        p.write_text(p.read_text() + line)
        return {}
    return apply


def _touch(*rels: str):
    def apply(tree: Path) -> dict:
        future = time.time() + 100
        for rel in rels:
            os.utime(tree / rel, (future, future))
        return {}
    return apply


def _newer_nvcc(tree: Path) -> dict:
    """A newer nvcc on PATH: the same compiler, another version string."""
    tool = tree.parent / "fake-bin" / "nvcc"
    tool.parent.mkdir(exist_ok=True)
    real = shutil.which("nvcc")
    tool.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then "{real}" --version | sed s/V13/V99/; '
                    f'else exec "{real}" "$@"; fi\n')
    tool.chmod(0o755)
    return {"PATH": f"{tool.parent}{os.pathsep}{os.environ['PATH']}"}


def corpus(k: str) -> dict:
    spec, body, ref = f"specs/{k}.yaml", f"kernels/{k}/{k}.cuh.j2", f"kernels/{k}/reference.py"
    return {
        "codegen param": _edit(spec, "eps: 1.0e-06", "eps: 1.0e-05"),
        "codegen variant": _edit(spec, "rows: 8", "rows: 4"),
        "generators": _edit(spec, "low: 0.5", "low: 0.25"),
        "validate": _edit(spec, "rel_max: 0.03", "rel_max: 0.02"),
        "perf": _edit(spec, "repeats: 7", "repeats: 9"),
        "description only": _edit(spec, "copies a row", "copies one row"),
        "comment only": _append(spec, "# a trailing comment\n"),
        "body": _edit(body, "copies its row, nothing more", "copies its row and nothing else"),
        "body comment at end": _append(body, "// trailing note\n"),
        "reference": _edit(ref, '"""Called with float64', '"""Called (edited) with float64'),
        "touch": _touch(spec, body, ref),
        "harness template (every kernel)": _edit("site_scons/mpkbuild/templates/harness.cu.j2",
                                                 "// harness.cu:", "// harness.cu (edited):"),
        "nvcc version (every kernel)": _newer_nvcc,
    }


ACTION_WORDS = ("spec", "generate", "compile", "validate", "perf", "review", "bandwidth", "wire")


def action_lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.split(" ", 1)[0] in ACTION_WORDS
            and not ln.startswith(" ")]


def file_hashes(tree: Path, rels) -> dict:
    import hashlib
    out = {}
    for rel in rels:
        try:
            out[rel] = hashlib.sha256((tree / rel).read_bytes()).hexdigest()
        except OSError:
            out[rel] = None
    return out


def sync_plain(plain: Path, graph: dict, changed_leaves: list[str]) -> None:
    """Mirror an edit's DIRECT effects into the twin: changed leaf files, changed facts."""
    for rel in changed_leaves:
        with open(plain / rel, "a") as fh:
            fh.write("edited\n")
    (plain / "graph.json").write_text(json.dumps(graph))


def dry_run_accuracy(tree: Path, plain: Path, k: str, limit: int | None,
                     out: Path | None = None) -> list[dict]:
    rows = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    graph = dump_graph(tree)
    cases = list(corpus(k).items())[:limit]
    env_extra: dict = {}
    for name, apply in cases:
        produced = {t for n in graph["nodes"] for t in n["targets"]}
        leaves = sorted({s for n in graph["nodes"] for s in n["sources"]} - produced)
        before = file_hashes(tree, leaves)
        env_extra = {**env_extra, **apply(tree)}
        env = scons_env(env_extra)
        after_graph = dump_graph(tree, env_extra)
        changed = [rel for rel, h in file_hashes(tree, leaves).items() if h != before[rel]]
        # plain SCons on the twin, given the same direct changes: what its -n lists
        sync_plain(plain, after_graph, changed)
        _, p = scons(plain, "-n")
        plain_listed = set(action_lines(p.stdout))
        plain_out = p.stdout
        # ours: the dry run, then the real build
        _, p = scons(tree, "-n", "kernel=all", "stage=review", EXECUTOR, env=env)
        listed = set(action_lines(p.stdout))
        dry_out = p.stdout
        runs_file = tree.parent / "fake-gpu-runs.txt"
        runs_file.unlink(missing_ok=True)
        _, p = scons(tree, "-j2", "kernel=all", "stage=review", EXECUTOR,
                     env={**env, "FAKE_GPU_RUNS": str(runs_file)})
        executed = set(action_lines(p.stdout))
        gpu_runs = runs_file.read_text().splitlines() if runs_file.exists() else []
        if out is not None:
            safe = "".join(c if c.isalnum() else "-" for c in name).strip("-")
            (out / f"{len(rows):02d}-{safe}.txt").write_text(
                f"edit: {name}\nchanged leaves: {changed}\n\n==== ours scons -n\n{dry_out}\n"
                f"==== ours build (executed)\n{p.stdout}\n{p.stderr}\n==== fake GPU runs\n"
                + "\n".join(gpu_runs) + f"\n\n==== plain twin scons -n\n{plain_out}")
        # the twin catches up (its own build), so the next edit starts from fresh there too
        scons(plain)
        # the same count computed from our graph: executed actions with a direct input changed
        old_facts = {n["label"]: set(n["facts"]) for n in graph["nodes"]}
        direct = {n["label"] for n in after_graph["nodes"] if n["label"] in executed and (
            set(n["sources"]) & set(changed) or set(n["facts"]) != old_facts.get(n["label"]))}
        graph = after_graph
        rows.append({"edit": name, "listed": len(listed), "executed": len(executed),
                     "exact": listed == executed, "gpu_runs": len(gpu_runs),
                     "gpu_runs_match": len(gpu_runs) == len([a for a in executed
                                                            if a.split()[0] in ("validate", "perf", "bandwidth")]),
                     "plain_listed": len(plain_listed), "plain_direct": len(direct),
                     "plain_ok": plain_listed <= executed and plain_listed == direct,
                     "missing": sorted(executed - listed), "extra": sorted(listed - executed)})
        print(f"  {name:<34} ours -n {len(listed):>3}  executed {len(executed):>3}  "
              f"{'exact' if listed == executed else 'DIFFERS'}  plain -n {len(plain_listed):>3}"
              f" (direct {len(direct)})", flush=True)
    return rows


# ---------------------------------------------------------------- profile
def profile(tree: Path, folder: Path, top: int = 25) -> str:
    """cProfile of `scons` (no-op) and `scons status` in the tree: the top functions by cumulative
    and by own time."""
    import pstats
    import io
    out = io.StringIO()
    for name, args in (("no-op", ["kernel=all", "stage=review", EXECUTOR]), ("status", ["status", EXECUTOR])):
        prof = folder / f"{name}.prof"
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "SCons", "-Q", *args],
                       cwd=tree, env=scons_env(), capture_output=True, check=True)
        for sort in ("cumulative", "tottime"):
            out.write(f"\n==== {name}: by {sort}\n")
            st = pstats.Stats(str(prof), stream=out)
            st.strip_dirs().sort_stats(sort).print_stats(top)
    return out.getvalue()


# ---------------------------------------------------------------- report
HEADING = "## Status and no-op speed (issue 3)"


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import SCons
    return (f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python "
            f"{platform.python_version()}, SCons {SCons.__version__}")


def render(results: list[dict], accuracy: list[dict], acc_n: int | None, runs: int, bare: float,
           command: str) -> str:
    date = subprocess.run(["date"], capture_output=True, text=True).stdout.strip()
    lines = [HEADING, "",
             f"`{command}`, {date}; {machine()}. Each figure is the median wall time of {runs} "
             "fresh `python -m SCons -Q` processes, the commands interleaved (plain no-op, "
             "ours no-op, ours status, then both no-ops with `--max-drift=0`, repeat). Synthetic trees: N kernels made from "
             "rmsnorm_v2.yaml (no wiring, 2 small variants, a trivial body), built once with "
             "`-j2 kernel=all stage=review` and the stand-in GPU executor (tests/fakes). Plain "
             "SCons: an SConstruct with the same Command nodes (targets, file sources, facts as "
             "Value nodes, side effects, default alias) taken from `mpkbuild.model.graph.build` on the "
             "same tree, lean (no default tools, no per-Command variables) and with our SCons "
             "settings (implicit cache off, content decider); its actions are trivial Python "
             "functions and its files are small (ours "
             "hashes its real outputs, e.g. ~1 MB per .so). "
             f"Bare SCons start-up (empty SConstruct): {bare:.2f} s.", "",
             "| N | nodes | files (targets + leaves) | plain no-op s | ours no-op s | status s "
             "| status / plain (≤ 0.2) | ours no-op / plain (≤ 1.1) | with `--max-drift=0`: plain "
             "/ ours no-op s (ratio) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s = r["shape"]
        lines.append(f"| {r['n']} | {s['nodes']} | {s['targets'] + s['leaves']} | {r['plain']:.2f} "
                     f"| {r['noop']:.2f} | {r['status']:.2f} | {r['status'] / r['plain']:.2f} "
                     f"| {r['noop'] / r['plain']:.2f} | {r['plain_md0']:.2f} / {r['noop_md0']:.2f} "
                     f"({r['noop_md0'] / r['plain_md0']:.2f}) |")
    if results:
        big = results[-1]
        verdict = lambda ok: "met" if ok else "NOT met"
        lines += ["", f"At N={big['n']}: status / plain = {big['status'] / big['plain']:.2f} "
                  f"(target ≤ 0.2: {verdict(big['status'] / big['plain'] <= 0.2)}); ours no-op / "
                  f"plain = {big['noop'] / big['plain']:.2f} (target ≤ 1.1: "
                  f"{verdict(big['noop'] / big['plain'] <= 1.1)})."]
    if accuracy:
        exact = sum(a["exact"] for a in accuracy)
        lines += ["", f"Dry-run accuracy over {len(accuracy)} edits on the N={acc_n} tree (one kernel "
                  "edited unless the edit says otherwise; the real build follows each dry run): "
                  f"**{exact}/{len(accuracy)} exact** — our `scons -n` listed exactly the actions "
                  f"the build executed ({sum(a['listed'] for a in accuracy)} listed, "
                  f"{sum(a['executed'] for a in accuracy)} executed). \"plain -n\" is the real "
                  "`scons -n` of the plain twin after mirroring the edit's direct effects into it "
                  "(changed source files, changed Value facts); it equals the executed actions "
                  "that have a changed direct input, counted from our graph (\"direct\").", "",
                  "| edit | ours `-n` | executed | exact | plain `-n` | direct |",
                  "|---|---:|---:|:---:|---:|---:|"]
        for a in accuracy:
            lines.append(f"| {a['edit']} | {a['listed']} | {a['executed']} | "
                         f"{'yes' if a['exact'] else 'NO'} | {a['plain_listed']} | {a['plain_direct']} |")
        tl, te = sum(a["plain_listed"] for a in accuracy), sum(a["executed"] for a in accuracy)
        lines.append(f"| **total** | {sum(a['listed'] for a in accuracy)} | {te} | "
                     f"{exact}/{len(accuracy)} | {tl} ({100 * tl / max(te, 1):.0f}%) | "
                     f"{sum(a['plain_direct'] for a in accuracy)} |")
    return "\n".join(lines) + "\n"


def write_results(path: Path, section: str) -> None:
    """Append the section (or replace this script's own earlier section, if it is there)."""
    text = path.read_text() if path.exists() else "# Measured results\n"
    if HEADING in text:
        head, rest = text.split(HEADING, 1)
        nxt = rest.find("\n## ")
        text = head + section.rstrip("\n") + ("\n" + rest[nxt:] if nxt >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,50,200")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--corpus-size", type=int, default=None, help="first K edits of the corpus only")
    ap.add_argument("--no-corpus", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile at the largest N, printed")
    ap.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (debugging)")
    ap.add_argument("--work", default=None,
                    help="folder for the trees, kept; a tree already built there by an earlier "
                         "run is reused (brought up to date, its twin remade) instead of rebuilt")
    ap.add_argument("--stand-in-nvcc", type=int, default=0, metavar="N",
                    help="the first (or catch-up) build of a tree of N or more kernels uses a stand-in nvcc (the real "
                         "one's --version, ~1 MB libraries, ptxas lines); no-ops, status and the "
                         "dry-run corpus always use the real nvcc")
    ap.add_argument("--out", default=None,
                    help="folder for the raw output (raw.json, summary.md, dryrun/); default: a new "
                         "temporary folder, printed at the end")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    command = "python bench/status_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.work:
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
        args.keep = True
    else:
        work = Path(tempfile.mkdtemp(prefix="mpk-status-bench-"))
    out = Path(args.out).resolve() if args.out else Path(tempfile.mkdtemp(prefix="mpk-status-bench-out-"))
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    results, accuracy, acc_n = [], [], None
    raw: dict = {"command": command.strip(), "machine": machine(), "runs": args.runs,
                 "loadavg_start": os.getloadavg(), "sizes": {}, "accuracy": None}

    def save_raw():
        (out / "raw.json").write_text(json.dumps(raw, indent=1))
    try:
        shutil.rmtree(work / "bare", ignore_errors=True)
        bare = bare_startup(work / "bare", args.runs)
        raw["bare_startup_s"] = bare
        print(f"bare SCons start-up: {bare:.2f} s", flush=True)
        for n in sizes:
            trees = {"ours": work / f"n{n}" / "tree", "plain": work / f"n{n}" / "plain"}
            reused = (trees["ours"] / ".sconsign.dblite").exists()
            if not reused:
                shutil.rmtree(trees["ours"], ignore_errors=True)
                make_tree(trees["ours"], n)
            else:                            # this checkout's library, over the kept tree's
                shutil.rmtree(trees["ours"] / "site_scons")
                shutil.copytree(REPO / "site_scons", trees["ours"] / "site_scons",
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            t0 = time.perf_counter()
            fast = bool(args.stand_in_nvcc) and n >= args.stand_in_nvcc
            scons(trees["ours"], "-j2", "kernel=all", "stage=review", EXECUTOR,
                  env=scons_env(stand_in_nvcc(work / "stand-in-bin")) if fast else None)
            t_build = time.perf_counter() - t0
            graph = dump_graph(trees["ours"])
            shutil.rmtree(trees["plain"], ignore_errors=True)
            shape = make_plain(trees["plain"], graph)
            scons(trees["plain"])
            print(f"N={n}: {shape['nodes']} nodes, {shape['targets']} targets, {shape['leaves']} "
                  f"leaf sources, {shape['edges']} input edges; "
                  f"{'catch-up build of the kept tree' if reused else 'first build'} {t_build:.0f} s"
                  f"{' (stand-in nvcc)' if fast else ''}",
                  flush=True)
            load_before = os.getloadavg()
            t = median_runs(trees, args.runs)
            med = {k: statistics.median(v) for k, v in t.items() if k != "cpu"}
            cpu = {k: statistics.median(v) for k, v in t["cpu"].items()}
            results.append({"n": n, "shape": shape, **med, "raw": t})
            raw["sizes"][str(n)] = {"shape": shape, "first_build_s": t_build, "reused": reused,
                                    "stand_in_nvcc": fast, "wall_s": t,
                                    "median_s": med, "median_cpu_s": cpu,
                                    "loadavg_before": load_before,
                                    "loadavg_after": os.getloadavg()}
            save_raw()
            print(f"  plain no-op {med['plain']:.2f} s  ours no-op {med['noop']:.2f} s  status "
                  f"{med['status']:.2f} s  ->  status/plain {med['status'] / med['plain']:.2f}  "
                  f"no-op/plain {med['noop'] / med['plain']:.2f}  (--max-drift=0: plain "
                  f"{med['plain_md0']:.2f} ours {med['noop_md0']:.2f}); CPU s: plain "
                  f"{cpu['plain']:.2f} ours {cpu['noop']:.2f} status {cpu['status']:.2f}; "
                  f"load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
            if n == min(sizes) and not args.no_corpus:
                acc_n = n
                print(f"dry-run accuracy, N={n}:", flush=True)
                accuracy = dry_run_accuracy(trees["ours"], trees["plain"], kernel_name(0),
                                            args.corpus_size, out / "dryrun")
                raw["accuracy"] = {"n": n, "rows": accuracy}
                save_raw()
            if n == max(sizes) and args.profile:
                print(profile(trees["ours"], work))
            if n != max(sizes) and not args.keep:
                shutil.rmtree(work / f"n{n}")
        section = render(results, accuracy, acc_n, args.runs, bare, command.strip())
        (out / "summary.md").write_text(section)
        print("\n" + section)
        if not args.no_results:
            write_results(Path(args.results), section)
            print(f"written to {args.results}")
        print(f"total {time.perf_counter() - t_start:.0f} s")
    finally:
        raw["loadavg_end"] = os.getloadavg()
        raw["total_s"] = time.perf_counter() - t_start
        save_raw()
        print(f"raw output in {out}")
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = [a for a in accuracy if not a["exact"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
