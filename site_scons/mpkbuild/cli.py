"""The command line: what `scons ...` asks for, the commands that answer without building
(status, check, dag, why=, the exact -n, new=), the build lock, the shared cache, the gate
order and the verdict table printed at the end.

`Build` is the state of one invocation: the loaded kernels, the executor, the GPU profile
and the request; every stage action receives it. The SCons tool (mpkbuild/site_tools/mpk.py) only
declares the graph this module plans.
"""
from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import SCons.Node
import SCons.Script
from SCons.Script import ARGUMENTS, GetOption

from mpkbuild import gpu as gpu_mod
from mpkbuild import run as run_mod
from mpkbuild import stages
from mpkbuild import status as status_mod
from mpkbuild.model import graph as graph_mod
from mpkbuild.model import spec as spec_mod
from mpkbuild.model.kernel import Kernel, discover
from mpkbuild.run.job import ExecutorError, GateInterrupted
from mpkbuild.stages.gates import GateCannotRun, require_gpu, verdict_line
from mpkbuild.stages.wire import WireRequest
from mpkbuild.util import config
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import ReadOnce, read_json

COMMANDS = ("status", "check", "dag")

# Every key=value the command line takes, in one place: mpkbuild's own and every built-in
# executor's (run/local.py, run/remote/ssh.py, run/remote/dask.py). Anything else is a
# misspelling and refused. An executor of your own (executor=module:Class) may name its
# extra ones in a class attribute OPTIONS (a tuple of names).
ARGUMENT_NAMES = (
    "kernel", "stage", "why", "new", "family", "cache", "gpu",          # what to build or show
    "apply", "unwire", "renumber", "mpk_root", "runtime",               # stage=wire, stage=runtime
    "executor", "gpus", "warm", "sanitize",                             # GPU gates (local)
    "gpu_host", "gpu_workdir", "gpu_python", "ssh_opts", "ssh_connect_timeout",   # ssh
    "scheduler", "scheduler_file", "scheduler_timeout",                 # dask
)
TARGET_NAMES = COMMANDS + ("mpk",)      # mpk: the default alias


@dataclass
class Build:
    """One scons invocation, as the stage actions see it."""
    root: Path
    executor: object
    should_stop: object = lambda: False     # SCons caught SIGINT/SIGTERM (set by the tool)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    fingerprint: object = None              # the GPU profile gates are judged for
    gpu_here: bool = False                  # ... and this machine's executor has that GPU
    real_gpu: object = None
    sanitize: str | None = None
    wire_request: WireRequest | None = None
    runtime_request: object = None          # stages/runtime/megakernel.RuntimeRequest: resolved once
    keep_going: bool = False
    failed_gate: str | None = None          # the first gate of this run that did not pass
    wire_run: object = None                 # the run's one wire plan (stages/wire.run_plan)
    info: dict[str, dict] = field(default_factory=dict)   # first target -> node parameters

    def load_kernel(self, name: str) -> Kernel:
        """A kernel of the project the build has not loaded (its spec cache refreshed)."""
        return stages.load_kernel(self.root, name)

    @staticmethod
    def fail(message: str) -> int:
        sys.stderr.write(f"mpk: error: {message}\n")
        return 1

    def ready_gpu(self, kernel_name: str, stage: str):
        if self.fingerprint is not None and not self.gpu_here:
            real = self.real_gpu
            raise GateCannotRun(
                f"{stage} {kernel_name}: gpu={self.fingerprint.key} asks for results from "
                f"{self.fingerprint.signature()}, and this machine has "
                f"{real.signature() if real else 'no GPU'}: run it on that GPU (or take it from a "
                "shared cache). Nothing was marked passed.")
        root = self.runtime_request.root if self.runtime_request else None
        args = f" mpk_root={root}" if stages.BY_NAME[stage].needs_checkout and root is not None else ""
        return require_gpu(self.fingerprint, self.executor.absence(), kernel_name, stage, args)

    def run_gate(self, job):
        try:
            return self.executor.run(job, should_stop=self.should_stop)
        except GateInterrupted as exc:
            raise GateCannotRun(f"{job.gate} {job.kernel}: {exc}; nothing was recorded") from None
        except ExecutorError as exc:    # a remote link or cluster failed mid-gate
            raise GateCannotRun(f"{job.gate} {job.kernel}: {exc}") from None


def note(message: str) -> None:
    """An mpk note while planning: stdout for a build, stderr when stdout is --json's alone
    or the dry run's list of actions."""
    stream = sys.stderr if GetOption("mpk_json") or GetOption("no_exec") else sys.stdout
    stream.write(f"mpk: {message}\n")




def fail_early(message: str) -> None:
    sys.stderr.write(f"mpk: error: {message}\n")
    SCons.Script.Exit(2)


# ---------------------------------------------------------------- the request
def _nearest(word: str, names) -> str:
    import difflib
    close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_command_line(extra_names=()) -> None:
    """Unknown key=value arguments and targets are errors naming the nearest valid one
    (before anything is built or written)."""
    names = ARGUMENT_NAMES + tuple(extra_names)
    for key in ARGUMENTS:
        if key not in names:
            fail_early(f"unknown argument {key}={ARGUMENTS[key]}{_nearest(key, names)} "
                       f"(arguments: {', '.join(sorted(names))}; scons -h)")
    for target in SCons.Script.COMMAND_LINE_TARGETS:
        if target in TARGET_NAMES or "/" in target or os.sep in target:
            continue                       # a command, the alias, or a path SCons resolves
        fail_early(f"unknown target {target!r}{_nearest(target, TARGET_NAMES)} "
                   f"(commands: {', '.join(COMMANDS)}; key=value arguments: scons -h)")


def parse_request(build: Build) -> tuple[list[str], str, bool]:
    """(kernel names, stage, whether the stage was defaulted to compile for want of a GPU)."""
    known = discover(build.root)
    wanted = ARGUMENTS.get("kernel", "all")
    if wanted == "all":
        names = known
    else:
        names = [n.strip() for n in wanted.split(",") if n.strip()]
        if not names:
            # `kernel=$K` with K unset must not build nothing and pass
            fail_early(f"kernel= names no kernel (give a name, a comma list or all; kernels: "
                       f"{', '.join(known) or 'none'})")
        unknown = [n for n in names if n not in known]
        if unknown:
            fail_early(f"unknown kernel {', '.join(unknown)}{_nearest(unknown[0], known)} (kernels: "
                       f"{', '.join(known) or 'none'}; a kernel is specs/<name>.yaml)")
    stage = ARGUMENTS.get("stage")
    defaulted = False
    if stage is None:
        stage = stages.DEFAULT_STAGE["gpu" if build.gpu_here else "cpu"]
        defaulted = not build.gpu_here
    if stage not in stages.NAMES:
        fail_early(f"unknown stage {stage!r}{_nearest(stage, stages.NAMES)} (stages: {', '.join(stages.NAMES)})")
    return names, stage, defaulted


def wire_request() -> WireRequest:
    from mpkbuild.run.local import flag
    apply, unwire = flag(ARGUMENTS, "apply", False), flag(ARGUMENTS, "unwire", False)
    renumber = flag(ARGUMENTS, "renumber", False)
    root = ARGUMENTS.get("mpk_root")
    from mpkbuild.stages.runtime.megakernel import Checkout
    from mpkbuild.util.config import RUNTIMES
    runtime = ARGUMENTS.get("runtime", "v1")
    if runtime not in RUNTIMES:
        fail_early(f"runtime={runtime}: expected one of {', '.join(RUNTIMES)} (v1, MPK's scheduler "
                   "and workers, is the default; v2 is the static-plan Runtime-V2)")
    if root is None:
        if apply or unwire or renumber:
            fail_early("apply=1, unwire=1 and renumber=1 need mpk_root=PATH (an MPK checkout)")
        return WireRequest(None, False, False, runtime=runtime)
    path = Path(SCons.Script.GetLaunchDir(), root).resolve()
    if not path.is_dir():
        fail_early(f"mpk_root={root}: {path} is not a folder")
    from mpkbuild.wire.errors import WireError
    from mpkbuild.wire.fsio import recover
    try:
        done = recover(path)               # a wire run that was killed: finished or undone
    except (WireError, OSError) as exc:
        fail_early(f"mpk_root={root}: {exc}")
    if done:
        note(done)
    if runtime != "v1":
        try:
            Checkout.require_runtime(path, runtime)   # wiring reads no deps/: cutlass is the gate's
        except FileNotFoundError as exc:
            fail_early(str(exc))
    return WireRequest(path, apply, unwire, renumber, runtime)


def runtime_request(request: WireRequest, stage: str):
    """The checkout the runtime gate runs in, resolved once. stage=runtime runs the kernels
    inside an MPK checkout's persistent kernel: without mpk_root= (or with a folder that is
    no MPK checkout) there is nothing it could run, so say so before anything is written
    rather than build nothing."""
    from mpkbuild.stages.runtime.megakernel import RuntimeRequest
    resolved = RuntimeRequest.resolve(request.mpk_root, request.runtime)
    if stages.BY_NAME[stage].needs_checkout and resolved.checkout is None:
        fail_early(resolved.why_none or f"stage={stage} needs mpk_root=PATH (an MPK checkout: the runtime "
                   "gate compiles each kernel into its persistent kernel; e.g. mpk_root=../shared/mirage/mpk)")
    return resolved


def sanitize_request() -> str | None:
    tool = ARGUMENTS.get("sanitize")
    if tool in (None, "", "0", "none"):
        return None
    from mpkbuild.run import sanitizer
    if tool not in sanitizer.TOOLS:
        fail_early(f"sanitize={tool}: expected one of {', '.join(sanitizer.TOOLS)}")
    return tool


def resolve_gpu(build: Build) -> None:
    """The GPU profile the GPU gates are judged for: gpu=<profile>, else the executor's GPU
    (this machine's, or the remote host's / cluster's)."""
    try:
        real = build.executor.fingerprint()
    except ExecutorError as exc:
        fail_early(f"executor {getattr(build.executor, 'name', '?')}: {exc} "
                   "(nothing was run or recorded)")
    want = ARGUMENTS.get("gpu")
    if want is None:
        build.fingerprint, build.gpu_here = real, real is not None
        return
    try:
        profile = gpu_mod.load_profile(build.root, want)
    except gpu_mod.ProfileError as exc:
        fail_early(str(exc))
    build.fingerprint = profile
    build.gpu_here = real is not None and real.signature() == profile.signature()
    build.real_gpu = real


def help_text(root: Path) -> str:
    lines = ["mpk kernel build graph", "", "usage: scons [kernel=NAME[,NAME]|all] [stage=STAGE] "
             "[-n] [-c] [-k] [-jN]",
             "       GPU gates: [gpus=0,1] [warm=0] [sanitize=memcheck|racecheck|synccheck]",
             "         executor=local (default; one GPU lease per running gate, -jN uses N GPUs)",
             "         executor=ssh gpu_host=USER@HOST [gpu_workdir=DIR] [gpu_python=python3]",
             "         executor=dask scheduler=tcp://HOST:8786   (pip install -e .[dask])",
             "         executor=module:Class   (your own; see docs/executors.md)",
             "       scons stage=wire mpk_root=PATH [apply=1] [unwire=1] [renumber=1]   registration edits",
             "       scons -jN stage=tune kernel=K [gpu=PROFILE] [gpus=0,1]   search tune.space: "
             "tuned/<profile>/K.json",
             "       scons stage=runtime mpk_root=PATH   each variant inside that checkout's persistent kernel (GPU)",
             "       ... runtime=v2   wire and runtime gate target Runtime-V2 (a checkout that has it)",
             "       scons status [kernel=..] [stage=..] [gpu=PROFILE] [--json]   fresh/stale (why)",
             "       scons check gpu=PROFILE      exit 1 if any gate for that GPU is stale/failed/missing",
             "       scons dag [kernel=..] [stage=..]   build/dag/<name>.dot/.mmd/.svg",
             "       scons why=FILE|[KERNEL:]SECTION.FIELD   what a change there would make stale",
             "       scons new=NAME family=A|B|C|D|E   scaffold a kernel (spec, body, reference)",
             "       options: cache=DIR (or MPK_CACHE) shares results; gpu=PROFILE judges/uses that GPU's results",
             "", "stages (stage= builds the stage and everything it needs; default: review "
             "with a GPU, compile without):"]
    for s in stages.STAGES:
        tags = [f"per {s.per}"] + (["gate"] if s.judges else []) + (["GPU"] if s.needs_gpu else [])
        lines.append(f"  {s.name:<9} {s.doc}  [{', '.join(tags)}]")
    lines += ["", "kernels: " + (", ".join(discover(root)) or "none"), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- commands that do not build
def report(build: Build, command: str, g: graph_mod.Graph, sconsign, names: list[str], stage: str,
           with_summary: bool) -> int:
    """status / check / dag / why= / the exact dry run: computed, printed, no build."""
    root = build.root
    predictor = status_mod.Predictor(root, build.kernels, build.wire_request, config.wiring_roots(root),
                                     build.runtime_request, g.gpu_key)
    targets = g.request(names, stage, with_summary)
    if command in ("why", "dag"):
        from mpkbuild import dagview       # networkx: only the commands that draw or walk it
    if command == "why":
        try:
            labels = dagview.why(ARGUMENTS["why"], g, names,
                                 {n: build.kernels[n].spec.data for n in names})
        except dagview.WhyError as exc:
            fail_early(str(exc))
        say(f"a change to {ARGUMENTS['why']} would make stale ({len(labels)} actions):")
        for label in labels:
            say(f"  {label}")
        return 0
    # what this request involves, and its gates this GPU profile cannot run (pending TIER-1)
    closure = stages.closure(stage)
    waiting = {n.label for n in g.nodes if n.waits and n.stage in closure and n.kernel in names}
    statuses = status_mod.compute(g, sconsign, predictor, build.gpu_here,
                                  only=g.needed_labels(targets) | waiting)
    running = running_build(root)
    if running and command in ("status", "check", "dry-run"):
        note(f"a build is running in this tree ({running}): what it has not finished yet "
             "shows as it was before it started")
    if command == "dry-run":
        for st in statuses:
            if st.will_run:
                say(st.label)
        here = [st for st in statuses if st.will_run and st.state == "pending"]
        if here:
            note(f"{len(here)} of these run on a GPU of profile {g.gpu_key}, which this machine does not "
                 f"have ({build.executor.absence() if build.fingerprint is None else 'another GPU here'}): "
                 "the build would stop at the first of them; stage=compile (and stage=wire) builds "
                 "what runs here")
        return 0
    if command == "dag":
        ag = dagview.restrict(dagview.action_graph(g), g, targets)
        name = f"{ARGUMENTS.get('kernel', 'all').replace(',', '+')}-{stage}"
        paths = dagview.write(ag, {s.label: s for s in statuses}, root / config.BUILD_DIRNAME / "dag", name)
        say("wrote " + ", ".join(os.path.relpath(p, root) for p in paths))
        return 0
    if GetOption("mpk_json"):
        say(status_mod.to_json(statuses, g.gpu_key))
    else:
        say(status_mod.table(statuses, g.gpu_key, details=bool(GetOption("mpk_details"))))
        others = [p for p in gpu_mod.profiles_with_results(root) if p != g.gpu_key]
        if others:
            say(f"\nresults also exist for GPU profiles: {', '.join(others)} (status gpu=<profile>)")
    if command == "check":
        waiting = [st for st in statuses if st.waits]
        if waiting:                        # never passed, never an error: listed
            say(f"check: {len(waiting)} gates wait for hardware GPU profile {g.gpu_key} is not:\n"
                + "\n".join(f"  {st.label}: {st.waits}" for st in waiting))
        bad = [st for st in statuses if st.gate and st.state != "fresh"]
        if bad:
            sys.stderr.write(f"mpk: check failed for GPU profile {g.gpu_key}: "
                             f"{len(bad)} gates are not fresh:\n")
            for st in bad:
                sys.stderr.write(f"  {st.label}: {st.state}"
                                 + (f" ({'; '.join(st.reasons[:3])})" if st.reasons else "") + "\n")
            return 1
        say(f"check: every gate for GPU profile {g.gpu_key} is fresh")
    return 0


def scaffold(root: Path) -> None:
    from mpkbuild import scaffold as scaffold_mod
    try:
        made = scaffold_mod.create(root, ARGUMENTS["new"], ARGUMENTS.get("family", ""))
    except scaffold_mod.ScaffoldError as exc:
        fail_early(str(exc))
    print("created " + ", ".join(os.path.relpath(p, root) for p in made))
    print(f"next: scons kernel={ARGUMENTS['new']} stage=compile   (see docs/adding-a-kernel.md)")
    SCons.Script.Exit(0)


# ---------------------------------------------------------------- a build
def use_cache(env, root: Path) -> None:
    folder = ARGUMENTS.get("cache") or os.environ.get("MPK_CACHE")
    if not folder:
        return
    path = Path(SCons.Script.GetLaunchDir(), folder).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail_early(f"cache={folder}: cannot create {path}: {exc.strerror}")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        fail_early(f"cache={folder}: {path} is not readable and writable by this user")
    env.CacheDir(str(path))


_LOCK = []      # the locked folder's descriptor: held (and the lock with it) until this process ends
LOCK_PID_FILE = ".mpk-build.lock"     # build/<this>: names the lock's holder, for the messages


def _lock_holder(root: Path) -> str | None:
    """The pid the build lock's pid file names, or None when it names none (it is gone)."""
    try:
        holder = (root / config.BUILD_DIRNAME / LOCK_PID_FILE).read_text().strip()
    except OSError:
        return None
    return holder if holder.isdigit() else None


def running_build(root: Path) -> str | None:
    """Who holds the build lock of this tree ("pid N", or that it is not known), or None."""
    import fcntl
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except OSError:
        holder = _lock_holder(root)
        return f"pid {holder}" if holder else "its pid is not known"
    finally:
        os.close(fd)


def take_build_lock(root: Path) -> None:
    """One building (or cleaning) scons per tree: a second one refuses at once. The lock is
    an flock on the tree's own folder, which neither `scons -c` nor deleting build/ (or the
    holder's pid file in it) can remove; the kernel drops it when its holder dies, however
    it dies. build/.mpk-build.lock only names the holder's pid, for the message."""
    import fcntl
    pid_file = root / config.BUILD_DIRNAME / LOCK_PID_FILE
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        holder = _lock_holder(root)
        who = (f"pid {holder}" if holder else
               f"its pid file {os.path.relpath(pid_file, root)} is gone, so which process is not known")
        fail_early(f"another scons is building in this tree ({who}); wait for it to "
                   f"finish or stop it. Nothing was changed. (status, -n, dag and why= do not lock)")
    _LOCK.append(fd)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    from mpkbuild.util.fsutil import write_atomic
    write_atomic(pid_file, f"{os.getpid()}\n")


def verdict_table(requested: dict, interrupted=lambda: False) -> None:
    """Printed at exit: every requested gate's verdict, from this run's nodes and results."""
    if GetOption("no_exec") or GetOption("clean") or GetOption("help"):
        return
    stopped = interrupted()
    failures = bool(SCons.Script.GetBuildFailures())
    rows = []
    for (kname, gate, label), (node, result_path) in requested.items():
        state = node.get_state()
        if state == SCons.Node.failed:    # the action failed: any result file is an old one
            verdict = "FAILED (see the error above)"
        elif state in (SCons.Node.executed, SCons.Node.up_to_date):
            res = read_json(result_path) if result_path else {"verdict": "pass"}
            row = stages.BY_NAME[gate]
            if row.summary and res:
                verdict = getattr(row.impl, row.summary)(res)
            else:
                verdict = verdict_line(res) if res else "pass"
        elif not stopped and not failures:
            continue      # a run that failed nowhere left it alone: not among the targets named
        else:
            last = read_json(result_path) if result_path else None
            verdict = ("not reached (the build was interrupted)" if stopped else
                       "not reached (the build stopped at the first failure; -k goes on)")
            verdict = (verdict
                       + (f"; its last result, not checked this run: {last.get('verdict')}"
                          if last and last.get("verdict") else ""))
        rows.append((kname, label, verdict[:130]))
    if stopped:
        say("\nmpk: the build was interrupted (SIGINT or SIGTERM): what was running finished or "
            "was stopped, nothing else started; run the same command again to go on")
    if not rows:
        return
    width = max(len(r[0]) for r in rows)
    say("\nverdicts:")
    for kname, label, verdict in rows:
        say(f"  {kname:<{width}}  {label:<16} {verdict}")


def gate_order(g: graph_mod.Graph, kernels: list[Kernel], closure) -> list[str]:
    """SCons hands out ready nodes in the order of its targets: the GPU gates go first,
    every validate before any perf (a failed validate blocks its perf, and validates are
    short), then the longest gate by its last recorded time, so -jN GPUs finish together.
    The gate's result, not its check: a failed verdict must not stop the others."""
    gates = [(k, gate) for gate in stages.GPU_GATES if gate in closure for k in kernels
             if g.requested.get((k.name, gate))]      # runtime: only with mpk_root=
    rank = {gate: i for i, gate in enumerate(stages.GPU_GATES)}
    order = sorted(gates, key=lambda kg: (rank[kg[1]],
                                          -g.stored.get(kg[0].rel.gate_result(kg[1], g.gpu_key), (None, 0.0))[1]))
    return [k.rel.gate_result(gate, g.gpu_key) for k, gate in order]


# The options a tree is built with, remembered in build/options.py (an SCons Variables
# file: `name = 'value'` lines) by the last build that gave them, and used when a later
# run does not: `scons status` after `scons stage=review mpk_root=X` judges the graph that
# build made. `name=` (empty) forgets one. Never what writes outside build/ (apply=,
# unwire=), nor what picks the executor or the GPU profile.
REMEMBERED = ("mpk_root", "gpus")
OPTIONS_FILE = "options.py"


def remembered_options(root: Path) -> dict[str, str]:
    """build/options.py as {name: value} (what SCons's Variables would read from it)."""
    import ast
    try:
        tree = ast.parse((root / config.BUILD_DIRNAME / OPTIONS_FILE).read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in REMEMBERED and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            out[node.targets[0].id] = node.value.value
    return out


def apply_remembered(root: Path) -> dict[str, str]:
    """Put the remembered options the command line does not give into ARGUMENTS; returns
    those used (status and the build say so)."""
    used = {}
    for name, value in remembered_options(root).items():
        if name not in ARGUMENTS:
            ARGUMENTS[name] = value
            used[name] = value
    for name in REMEMBERED:
        if ARGUMENTS.get(name) == "":
            del ARGUMENTS[name]              # `name=`: forget it
    return used


def remember_options(root: Path, skip=()) -> None:
    """What this build was given of REMEMBERED, for the runs after it (not what it took from
    mpkbuild.yaml: skip)."""
    from mpkbuild.util.fsutil import write_atomic
    keep = {n: ARGUMENTS[n] for n in REMEMBERED if ARGUMENTS.get(n) and n not in skip}
    path = root / config.BUILD_DIRNAME / OPTIONS_FILE
    if not keep and not path.exists():
        return
    text = ("# The options this tree was last built with (mpkbuild, SCons Variables format): a run\n"
            "# that does not give one uses it; `name=` forgets it.\n"
            + "".join(f"{n} = {v!r}\n" for n, v in keep.items()))
    write_atomic(path, text, only_if_changed=True)


def load_companions(build: Build, root: Path, kernels: list) -> list:
    """The kernels the requested ones' runtime blocks run beside them, not requested
    themselves: in the graph (their spec and generate nodes feed the megakernel), never
    asked for. A block naming a kernel without a spec stops here."""
    from mpkbuild.stages.runtime.megakernel import block_kernels
    from mpkbuild.stages.tune import apply_tuned
    out = []
    for k in kernels:
        for name in block_kernels(k.spec.data):
            if name in build.kernels:
                continue
            if not (root / config.SPEC_DIRNAME / f"{name}.yaml").is_file():
                field = next(("runtime", "blocks", bi, "layers", li, "kernel")
                             for bi, b in enumerate(k.spec.data["runtime"]["blocks"])
                             for li, l in enumerate(b["layers"]) if l["kernel"] == name)
                fail_early(str(spec_mod.error_at(root / k.spec.file, root, field, f"no kernel {name!r} "
                                                 f"({config.SPEC_DIRNAME}/{name}.yaml does not exist)")))
            try:
                build.kernels[name] = apply_tuned(stages.load_kernel(root, name, write_cache=False),
                                                  build.fingerprint)
            except spec_mod.SpecError as exc:
                fail_early(str(exc))
            out.append(build.kernels[name])
    return out


def arguments(root: Path) -> tuple[str, ...]:
    """Read the project (mpkbuild.yaml) and put the remembered options and the project's
    default checkout in force; the names that came from the project (never remembered)."""
    from mpkbuild.model.project import ProjectError, use_project
    try:
        project = use_project(root)        # mpkbuild.yaml: the folders, the default checkout
    except ProjectError as exc:
        fail_early(str(exc))
    SCons.Script.Help(help_text(root), append=False)
    if GetOption("help"):
        return ()
    none_asked = ARGUMENTS.get("mpk_root") == ""      # `mpk_root=`: no checkout, this run
    for name, value in apply_remembered(root).items():
        note(f"{name}={value} (remembered in {config.BUILD_DIRNAME}/{OPTIONS_FILE}; give {name}= to forget it)")
    if project.mpk_root is not None and "mpk_root" not in ARGUMENTS and not none_asked:
        ARGUMENTS["mpk_root"] = str(project.mpk_root)   # the project's default checkout
        return ("mpk_root",)                             # ... which is not remembered
    return ()


def executor_request():
    """The executor= asked for (local by default), its options checked."""
    try:
        executor = run_mod.load(ARGUMENTS.get("executor"), dict(ARGUMENTS))
    except ExecutorError as exc:
        fail_early(str(exc))
    except (ValueError, ImportError, AttributeError) as exc:
        fail_early(f"executor: {exc}")
    check_command_line(getattr(type(executor), "OPTIONS", ()))
    return executor


def load_kernels(build: Build, names: list[str]) -> None:
    """The requested kernels, each with the committed tuned file of the build's GPU profile
    applied (tuned/<profile>/K.json); a bad spec stops here."""
    from mpkbuild.stages.tune import apply_tuned
    for name in names:
        try:
            build.kernels[name] = apply_tuned(stages.load_kernel(build.root, name, write_cache=False),
                                              build.fingerprint)
        except spec_mod.SpecError as exc:
            fail_early(str(exc))


def verdict_rows(g: graph_mod.Graph, kernels: list, closure, targets: list[str]) -> dict:
    """(kernel, stage, column) -> verdict file of each node the verdict table reports: the
    requested kernels' nodes this stage builds (a gate's own node: its check is not built
    when a later gate is asked for)."""
    needed = g.needed_labels(targets)
    asked = {k.name for k in kernels}
    return {(n.kernel, n.stage, n.column): g.root / n.verdict_file for n in g.nodes
            if n.reported and n.kernel in asked and n.stage in closure and n.label in needed}


def plan(env, should_stop) -> tuple[Build, graph_mod.Graph, list[str], dict]:
    """Everything up to declaring nodes: parse, load, answer the commands that do not build
    (they exit here), lock. Returns the build, its graph, the default targets (gates first)
    and the nodes the verdict table reports."""
    root = Path(env.Dir("#").abspath)
    from_project = arguments(root)
    build = Build(root=root, executor=executor_request(), should_stop=should_stop,
                  keep_going=bool(GetOption("keep_going")))
    build.sanitize = sanitize_request()
    if "new" in ARGUMENTS:
        scaffold(root)
    resolve_gpu(build)
    command = next((c for c in COMMANDS if c in SCons.Script.COMMAND_LINE_TARGETS), None)
    if command is None and "why" in ARGUMENTS:
        command = "why"
    if command is not None and "stage" not in ARGUMENTS:
        ARGUMENTS["stage"] = stages.EVERYTHING    # status and friends look at everything by default
    names, stage, defaulted = parse_request(build)
    build.wire_request = wire_request()
    if GetOption("help"):
        return build, None, [], {}
    build.runtime_request = runtime_request(build.wire_request, stage)
    load_kernels(build, names)
    with_summary = stage == stages.EVERYTHING and ARGUMENTS.get("kernel", "all") == "all"
    kernels = [build.kernels[n] for n in names]
    members = kernels + load_companions(build, root, kernels)
    from mpkbuild import sconsign as sconsign_mod
    sconsign = sconsign_mod.Sconsign(root)
    files = ReadOnce(root)                 # planning's reads: each file once (status too)
    g = stages.build_graph(root, members, build.fingerprint, build.wire_request, with_summary,
                           tampered=lambda rel: sconsign_mod.tampered(files, sconsign, rel),
                           sanitize=build.sanitize, files=files, runtime_request=build.runtime_request)
    for message in g.untrusted:            # outputs edited since their build wrote them
        note(message)
    for where, message in g.notes:         # a stage's word on the run (the runtime gate's checkout)
        if where in stages.closure(stage) or command is not None:
            note(message)
    if command is None and GetOption("no_exec") and not GetOption("clean"):
        command = "dry-run"                # plain `scons -n` under-reports; ours is exact
    if command is not None:
        SCons.Script.Exit(report(build, command, g, sconsign, names, stage, with_summary))
    use_cache(env, root)
    take_build_lock(root)                  # a clean too: it removes what a build writes
    if not GetOption("clean"):
        from mpkbuild.util.fsutil import remove_orphaned_temps
        remove_orphaned_temps(root / config.BUILD_DIRNAME)   # left by a build killed mid-write
    for k in kernels:
        k.save_spec_cache()                # only now: bad input above must write nothing
    g.code.save()                          # the code digests this plan computed
    if not GetOption("clean"):
        remember_options(root, skip=from_project)
    closure = stages.closure(stage)
    targets = g.request(names, stage, with_summary)
    requested = verdict_rows(g, kernels, closure, targets)
    if not targets:
        print(f"mpk: nothing to build for stage={stage} (no requested kernel has a "
              f"{'wiring section' if stage == 'wire' else 'node for it'})")
    if defaulted and not SCons.Script.COMMAND_LINE_TARGETS:
        print(f"mpk: no CUDA GPU here ({build.executor.absence()}): default stage is compile; "
              "validate/perf run on the GPU box (stage=validate here fails by design)")
    targets = list(dict.fromkeys(gate_order(g, kernels, closure) + targets)) if targets else []
    return build, g, targets, requested


def report_at_exit(env, requested: dict, interrupted) -> None:
    """The verdict table for these (kernel, gate, label) -> result path entries;
    interrupted() says whether SCons caught a signal."""
    nodes = {key: (env.File(str(path)), path) for key, path in requested.items()}
    atexit.register(verdict_table, nodes, interrupted)
