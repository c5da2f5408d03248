"""SCons tool `mpk`: declares each kernel's stages as nodes of one DAG.

Thin by design: it reads the command line (kernel=, stage=, executor=), loads the
requested specs through mpkbuild, and for every row of mpkbuild.stages.STAGES declares
the nodes and actions; all real work happens in mpkbuild. SCons decides what runs (by
content); the executor only decides where a GPU gate runs.
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import SCons.Action
import SCons.Node
import SCons.Script
from SCons.Script import ARGUMENTS, GetOption

from mpkbuild import codegen, config, gates, perfcheck, review, stages, wirestage
from mpkbuild import gpu as gpu_mod
from mpkbuild import graph as graph_mod
from mpkbuild import status as status_mod
from mpkbuild import compile as nvcc
from mpkbuild import executor as executor_mod
from mpkbuild import spec as spec_mod
from mpkbuild.fsutil import write_json_atomic
from mpkbuild.kernel import Kernel, bandwidth_file, discover

PKG = config.PACKAGE_DIR
_KERNELS: dict[str, Kernel] = {}
_STATE: dict = {}


def _fail(message: str) -> int:
    sys.stderr.write(f"mpk: error: {message}\n")
    return 1


# ---------------------------------------------------------------- actions
def _spec_action(target, source, env):
    env = _info(target)
    k = _KERNELS[env["MPK_KERNEL"]]
    for name, section in k.spec.sections.items():
        write_json_atomic(k.section_file(name), section)
    write_json_atomic(k.spec_json, k.spec.cache_record())
    return 0


def _generate_action(target, source, env):
    env = _info(target)
    k = _KERNELS[env["MPK_KERNEL"]]
    section = gates.read_result(k.section_file("codegen"))
    try:
        codegen.generate_file(env["MPK_ROLE"], section, k.spec.file, k.body_source, k.root,
                              Path(target[0].abspath))
    except codegen.TemplateError as exc:
        return _fail(str(exc))
    return 0


def _compile_action(target, source, env):
    env = _info(target)
    k = _KERNELS[env["MPK_KERNEL"]]
    arch = env["MPK_ARCH"]
    plan = codegen.smem_plan(k.spec.data["codegen"])
    job = nvcc.CompileJob(kernel=k.name, arch=arch, variants=k.variants,
                          harness=k.generated["harness"], library=k.library(arch),
                          resources=k.resources(arch), log=k.arch_dir(arch) / "compile.log",
                          smem_total=plan["total"], smem_budget=plan["budget"])
    try:
        nvcc.run_compile(job, env["MPK_NVCC_CMD"], k.root)
    except nvcc.CompileError as exc:
        return _fail(str(exc))
    return 0


def _lock_for(source, root: Path, fingerprint=None) -> dict:
    """{input: signature} for an action's sources (files hashed, facts verbatim)."""
    items = []
    for node in source:
        if isinstance(node, SCons.Node.FS.File):
            items.append((os.path.relpath(node.abspath, root), Path(node.abspath)))
        else:
            items.append((f"value:{node}", str(node.read())))
    if fingerprint is not None:
        items.append(("gpu", fingerprint.signature()))
    return gates.input_lock(root, items)


def _interrupted() -> bool:
    """Whether SCons caught SIGINT/SIGTERM: SCons lets running actions finish, but a GPU gate
    can run for minutes, so the executor polls this and stops the gate's process group.
    SCons keeps the flag on the Jobs object bound as a default of its signal handler."""
    import signal
    handler = signal.getsignal(signal.SIGINT)
    try:
        return bool(handler.__defaults__[0].job.interrupted())
    except (AttributeError, IndexError, TypeError):
        return False


def _run_gate(job):
    try:
        return _STATE["executor"].run(job, should_stop=_interrupted)
    except executor_mod.GateInterrupted as exc:
        raise gates.GateCannotRun(f"{job.gate} {job.kernel}: {exc}; nothing was recorded") from None
    except executor_mod.ExecutorError as exc:    # a remote link or cluster failed mid-gate
        raise gates.GateCannotRun(f"{job.gate} {job.kernel}: {exc}") from None


def _ready_gpu(kernel_name: str, stage: str):
    ex = _STATE["executor"]
    if _STATE["fingerprint"] is not None and not _STATE["gpu_here"]:
        real = _STATE.get("real_gpu")
        raise gates.GateCannotRun(
            f"{stage} {kernel_name}: gpu={_STATE['fingerprint'].key} asks for results from "
            f"{_STATE['fingerprint'].signature()}, and this machine has "
            f"{real.signature() if real else 'no GPU'}: run it on that GPU (or take it from a "
            "shared cache). Nothing was marked passed.")
    return gates.require_gpu(_STATE["fingerprint"], ex.absence(), kernel_name, stage)


def _bandwidth_action(target, source, env):
    env = _info(target)
    root = Path(env["MPK_ROOT"])
    job = executor_mod.GateJob("bandwidth", "-", {"root": str(root)},
                               Path(target[0].abspath).parent, timeout_s=300, root=root)
    try:
        fp = _ready_gpu("all", "perf")
        result = _run_gate(job)
    except gates.GateCannotRun as exc:
        return _fail(str(exc))
    full = gates.record(result, gate="bandwidth", kernel="-", fingerprint=fp,
                        lock=_lock_for(source, root, fp), result_path=Path(target[0].abspath),
                        verdict_path=None)
    if full["verdict"] != "pass":
        Path(target[0].abspath).unlink(missing_ok=True)
        return _fail(f"copy-bandwidth measurement failed: {gates.verdict_line(full)}")
    print(f"          {full['message']}")
    return 0


def _gate_action(target, source, env):
    env = _info(target)
    k = _KERNELS[env["MPK_KERNEL"]]
    gate = env["MPK_GATE"]
    try:
        fp = _ready_gpu(k.name, gate)
        arch = gates.arch_for(fp, k.archs, k.name)
    except gates.GateCannotRun as exc:
        return _fail(str(exc))
    payload = {"root": str(k.root), "library": str(k.library(arch)),
               "codegen": gates.read_result(k.section_file("codegen")),
               "generators": gates.read_result(k.section_file("generators")),
               gate: gates.read_result(k.section_file(gate))}
    blocked = gate == "perf" and \
        (Path(target[0].abspath).parent / "validate.verdict").read_text().strip() != "pass"
    if blocked:
        result = {"verdict": "blocked", "message": "not run: validate did not pass on this GPU"}
    elif _STATE.get("failed_gate") and not GetOption("keep_going"):
        # gates are handed out before their checks: keep SCons's stop-at-first-failure
        return _fail(f"{gate} {k.name}: not run, {_STATE['failed_gate']} did not pass "
                     "(-k runs every gate)")
    else:
        inputs = [k.library(arch), k.reference_file if gate == "validate" else k.baseline_file]
        if gate == "perf":
            payload["bandwidth_file"] = str(bandwidth_file(k.root, fp.key))
            inputs.append(bandwidth_file(k.root, fp.key))
        section = payload[gate][gate]
        job = executor_mod.GateJob(
            gate, k.name, payload, Path(target[0].abspath).parent, section["timeout_s"],
            root=k.root, inputs=tuple(dict.fromkeys(os.path.relpath(p, k.root) for p in inputs)),
            sanitize=_STATE["sanitize"] if gate == "validate" else None,
            share_gpu=bool(section.get("share_gpu", False)) and gate == "validate")
        try:
            result = _run_gate(job)
        except gates.GateCannotRun as exc:
            return _fail(str(exc))
        if gate == "perf":       # the runners time; the verdict is made here, the same for every executor
            result = perfcheck.judge(result, section["thresholds"], list(payload["codegen"]["codegen"]["variants"]))
    full = gates.record(result, gate=gate, kernel=k.name, fingerprint=fp,
                        lock=_lock_for(source, k.root, fp), result_path=Path(target[0].abspath),
                        verdict_path=Path(target[1].abspath))
    print(f"          {gate} {k.name}: {gates.verdict_line(full)} ({full.get('elapsed_s', '?')} s)")
    if full["verdict"] not in ("pass", "blocked"):
        _STATE["failed_gate"] = f"{gate} {k.name}"
    return 0


def _check_action(target, source, env):
    """The exit status of a gate: fails (and is re-checked next run) unless the verdict is pass."""
    env = _info(target)
    res = gates.read_result(Path(source[0].abspath))
    stamp = Path(target[0].abspath)
    if res and res.get("verdict") == "pass":
        stamp.write_text("pass\n")
        return 0
    stamp.unlink(missing_ok=True)
    log = Path(source[0].abspath).with_suffix(".log")
    return _fail(f"{env['MPK_GATE']} {env['MPK_KERNEL']}: "
                 f"{gates.verdict_line(res) if res else 'no result'}\n  result: {source[0]}  log: "
                 f"{os.path.relpath(log, env['MPK_ROOT'])}")


def _wire_action(target, source, env):
    env = _info(target)
    k = _KERNELS[env["MPK_KERNEL"]]
    request = _STATE["wire_request"]
    specs = [x.spec.data for x in _all_wired_kernels(k.root)] if request.mpk_root else []
    try:
        manifest = wirestage.run_wire(k, specs, request, k.root / "wiring")
    except wirestage.WireGateFailed as exc:
        return _fail(str(exc))
    print(f"          wire {k.name}: {manifest['message']}")
    return 0


def _all_wired_kernels(root: Path) -> list[Kernel]:
    """Every kernel with a wiring section: TaskType numbers and names must not clash."""
    out = []
    for name in discover(root):
        k = _KERNELS.get(name) or Kernel.load(root, name)
        if k.has_wiring:
            out.append(k)
    return out


def _review_action(target, source, env):
    env = _info(target)
    k = _KERNELS[env["MPK_KERNEL"]]
    key = env["MPK_GPU_KEY"]
    data = review.kernel_review(
        k.name, k.build_dir, k.archs, key, {a: k.resources(a) for a in k.archs},
        {g: k.gate_result(g, key) for g in stages.GPU_GATES},
        k.wire_result if k.has_wiring else None)
    # the inputs' signatures: the data changes whenever an input did, so the summary that
    # reads it re-runs exactly when a review ran (the exact dry run relies on that)
    data["inputs"] = _lock_for(source, k.root)
    try:
        review.write_kernel_review(data, Path(target[0].abspath), Path(target[1].abspath))
    except codegen.TemplateError as exc:
        return _fail(str(exc))
    return 0


def _summary_action(target, source, env):
    review.write_summary([Path(s.abspath) for s in source if s.abspath.endswith(".json")],
                         Path(target[0].abspath))
    return 0


_INFO: dict[str, dict] = {}       # first target's path -> the node's parameters


def _info(target) -> dict:
    """A node's parameters (kernel, role, arch, label...), looked up by its first target.
    Kept out of construction variables (no override environment per Command): every
    parameter is already fixed by the target's path or by a fact the node depends on."""
    return _INFO[str(target[0])]


def _action(fn):
    """A Python action whose printed line is the graph node's label (silent nodes: none)."""
    return SCons.Action.Action(fn, strfunction=lambda t, s, e: _info(t).get("MPK_LABEL"))


ACTIONS = {
    "spec": _action(_spec_action),
    "generate": _action(_generate_action),
    "compile": _action(_compile_action),
    "wire": _action(_wire_action),
    "bandwidth": _action(_bandwidth_action),
    "gate": _action(_gate_action),
    "check": _action(_check_action),
    "review": _action(_review_action),
    "summary": _action(_summary_action),
}


# ---------------------------------------------------------------- declaration
def _declare(env, g: graph_mod.Graph) -> None:
    """Declare every node of the graph model as an SCons Command: nothing else decides."""
    for node in g.nodes:
        sources = [env.File(s) for s in node.sources] + [env.Value(f) for f in node.facts]
        targets = env.Command(list(node.targets), sources, ACTIONS[node.kind])
        _INFO[str(targets[0])] = {"MPK_ROOT": str(g.root), "MPK_KERNEL": node.kernel or "",
                                  "MPK_GPU_KEY": g.gpu_key, **dict(node.opts),
                                  "MPK_LABEL": None if node.silent else node.label}
        for side in node.side_effects:
            env.SideEffect(side, targets)
        if node.always:
            env.AlwaysBuild(targets)
    for k in _KERNELS.values():
        env.Clean(env.File(str(k.spec_json)), str(k.build_dir))


def _fail_early(message: str) -> None:
    sys.stderr.write(f"mpk: error: {message}\n")
    SCons.Script.Exit(2)


def _parse_request(root: Path) -> tuple[list[str], str]:
    known = discover(root)
    wanted = ARGUMENTS.get("kernel", "all")
    if wanted == "all":
        names = known
    else:
        names = [n.strip() for n in wanted.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            _fail_early(f"unknown kernel {', '.join(unknown)} (kernels: {', '.join(known) or 'none'}; "
                        f"a kernel is specs/<name>.yaml)")
    stage = ARGUMENTS.get("stage")
    if stage is None:
        stage = "review" if _STATE["gpu_here"] else "compile"
        _STATE["default_stage_note"] = stage == "compile"
    if stage not in stages.NAMES:
        _fail_early(f"unknown stage {stage!r} (stages: {', '.join(stages.NAMES)})")
    return names, stage


def _wire_request() -> wirestage.WireRequest:
    flag = lambda name: ARGUMENTS.get(name, "0") not in ("0", "", "no", "false")
    root = ARGUMENTS.get("mpk_root")
    if root is None:
        if flag("apply") or flag("unwire"):
            _fail_early("apply=1 and unwire=1 need mpk_root=PATH (an MPK checkout)")
        return wirestage.WireRequest(None, False, False)
    path = Path(SCons.Script.GetLaunchDir(), root).resolve()
    if not path.is_dir():
        _fail_early(f"mpk_root={root}: {path} is not a folder")
    return wirestage.WireRequest(path, flag("apply"), flag("unwire"))


def _help_text(root: Path) -> str:
    lines = ["mpk kernel build graph", "", "usage: scons [kernel=NAME[,NAME]|all] [stage=STAGE] "
             "[-n] [-c] [-k] [-jN]",
             "       GPU gates: [gpus=0,1] [warm=0] [share_perf=0] [sanitize=memcheck|racecheck|synccheck]",
             "         executor=local (default; one GPU lease per running gate, -jN uses N GPUs)",
             "         executor=ssh gpu_host=USER@HOST [gpu_workdir=DIR] [gpu_python=python3]",
             "         executor=dask scheduler=tcp://HOST:8786   (pip install -e .[dask])",
             "         executor=module:Class   (your own; see docs/executors.md)",
             "       scons stage=wire mpk_root=PATH [apply=1] [unwire=1]   registration edits",
             "       scons status [kernel=..] [stage=..] [gpu=PROFILE] [--json]   fresh/stale (why)",
             "       scons check gpu=PROFILE      exit 1 if any gate for that GPU is stale/failed/missing",
             "       scons dag [kernel=..] [stage=..]   build/dag/<name>.dot/.mmd/.svg",
             "       scons why=FILE|[KERNEL:]SECTION.FIELD   what a change there would make stale",
             "       scons new=NAME family=A|B|C|D|E   scaffold a kernel (spec, body, reference)",
             "       options: cache=DIR (or MPK_CACHE) shares results; gpu=PROFILE judges/uses that GPU's results",
             "", "stages (stage= builds the stage and everything it needs; default: review "
             "with a GPU, compile without):"]
    for s in stages.STAGES:
        tags = [f"per {s.per}"] + (["gate"] if s.is_gate else []) + (["GPU"] if s.needs_gpu else [])
        lines.append(f"  {s.name:<9} {s.doc}  [{', '.join(tags)}]")
    lines += ["", "kernels: " + (", ".join(discover(root)) or "none"), ""]
    return "\n".join(lines)


def _verdict_table(requested: dict) -> None:
    """Printed at exit: every requested gate's verdict, from this run's nodes and results."""
    if GetOption("no_exec") or GetOption("clean") or GetOption("help"):
        return
    rows = []
    for (kname, gate, label), (node, result_path) in requested.items():
        state = node.get_state()
        if state == SCons.Node.failed:    # the action failed: any result file is an old one
            verdict = "FAILED (see the error above)"
        elif state in (SCons.Node.executed, SCons.Node.up_to_date):
            res = gates.read_result(result_path) if result_path else {"verdict": "pass"}
            verdict = gates.verdict_line(res) if res else "pass"
        else:
            verdict = "not reached (the build stopped at the first failure; -k goes on)"
        rows.append((kname, label, verdict[:110]))
    if not rows:
        return
    width = max(len(r[0]) for r in rows)
    print("\nverdicts:")
    for kname, label, verdict in rows:
        print(f"  {kname:<{width}}  {label:<16} {verdict}")


COMMANDS = ("status", "check", "dag")


def _sanitize_request() -> str | None:
    tool = ARGUMENTS.get("sanitize")
    if tool in (None, "", "0", "none"):
        return None
    from mpkbuild import sanitizer
    if tool not in sanitizer.TOOLS:
        _fail_early(f"sanitize={tool}: expected one of {', '.join(sanitizer.TOOLS)}")
    return tool


def _resolve_gpu(root: Path) -> None:
    """The GPU profile the GPU gates are judged for: gpu=<profile>, else the executor's GPU
    (this machine's, or the remote host's / cluster's)."""
    try:
        real = _STATE["executor"].fingerprint()
    except executor_mod.ExecutorError as exc:
        _fail_early(f"executor {getattr(_STATE['executor'], 'name', '?')}: {exc} "
                    "(nothing was run or recorded)")
    want = ARGUMENTS.get("gpu")
    if want is None:
        _STATE["fingerprint"], _STATE["gpu_here"] = real, real is not None
        return
    try:
        profile = gpu_mod.load_profile(root, want)
    except gpu_mod.ProfileError as exc:
        _fail_early(str(exc))
    _STATE["fingerprint"] = profile
    _STATE["gpu_here"] = real is not None and real.signature() == profile.signature()
    _STATE["real_gpu"] = real


def _use_cache(env, root: Path) -> None:
    folder = ARGUMENTS.get("cache") or os.environ.get("MPK_CACHE")
    if not folder:
        return
    path = Path(SCons.Script.GetLaunchDir(), folder).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail_early(f"cache={folder}: cannot create {path}: {exc.strerror}")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        _fail_early(f"cache={folder}: {path} is not readable and writable by this user")
    env.CacheDir(str(path))


def _take_build_lock(root: Path) -> None:
    """One building scons per tree: a second one refuses at once (the lock dies with its
    holder, however it dies)."""
    import fcntl
    lock_path = root / config.BUILD_DIRNAME / ".mpk-build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(lock_path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        _fail_early(f"another scons is building in this tree (pid {holder}); wait for it to "
                    f"finish or stop it. Nothing was changed. (status, -n, dag and why= do not lock)")
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    _STATE["lock"] = fh


def _report(command: str, g: graph_mod.Graph, sconsign, root: Path, names: list[str], stage: str,
            with_summary: bool) -> int:
    """status / check / dag / why= / the exact dry run: computed, printed, no build."""
    predictor = status_mod.Predictor(root, _KERNELS, _STATE["wire_request"], root / "wiring")
    targets = g.request(names, stage, with_summary)
    if command in ("why", "dag"):
        from mpkbuild import dagview       # networkx: only the commands that draw or walk it
    if command == "why":
        try:
            labels = dagview.why(ARGUMENTS["why"], g, names)
        except dagview.WhyError as exc:
            _fail_early(str(exc))
        print(f"a change to {ARGUMENTS['why']} would make stale ({len(labels)} actions):")
        for label in labels:
            print(f"  {label}")
        return 0
    statuses = status_mod.compute(g, sconsign, predictor, _STATE["gpu_here"],
                                  only=g.needed_labels(targets))
    if command == "dry-run":
        for st in statuses:
            if st.will_run:
                print(st.label)
        return 0
    if command == "dag":
        ag = dagview.restrict(dagview.action_graph(g), g, targets)
        name = f"{ARGUMENTS.get('kernel', 'all').replace(',', '+')}-{stage}"
        paths = dagview.write(ag, {s.label: s for s in statuses}, root / config.BUILD_DIRNAME / "dag", name)
        print("wrote " + ", ".join(os.path.relpath(p, root) for p in paths))
        return 0
    if GetOption("mpk_json"):
        print(status_mod.to_json(statuses, g.gpu_key))
    else:
        print(status_mod.table(statuses, g.gpu_key))
        others = [p for p in gpu_mod.known_profiles(root) if p != g.gpu_key]
        if others:
            print(f"\nresults also exist for GPU profiles: {', '.join(others)} (status gpu=<profile>)")
    if command == "check":
        bad = [st for st in statuses if st.kind in ("gate", "compile", "wire") and st.state != "fresh"]
        if bad:
            sys.stderr.write(f"mpk: check failed for GPU profile {g.gpu_key}: "
                             f"{len(bad)} gates are not fresh:\n")
            for st in bad:
                sys.stderr.write(f"  {st.label}: {st.state}"
                                 + (f" ({'; '.join(st.reasons[:3])})" if st.reasons else "") + "\n")
            return 1
        print(f"check: every gate for GPU profile {g.gpu_key} is fresh")
    return 0


def declare(env) -> list:
    """Declare everything the command line asks for; returns the default targets."""
    root = Path(env.Dir("#").abspath)
    env["MPK_ROOT"] = str(root)
    SCons.Script.Help(_help_text(root), append=False)
    try:
        _STATE["executor"] = executor_mod.load(ARGUMENTS.get("executor"), dict(ARGUMENTS))
    except executor_mod.ExecutorError as exc:
        _fail_early(str(exc))
    except (ValueError, ImportError, AttributeError) as exc:
        _fail_early(f"executor: {exc}")
    if hasattr(_STATE["executor"], "jobs"):     # a perf gate may share its variants over -j GPUs
        _STATE["executor"].jobs = _jobs()
    _STATE["sanitize"] = _sanitize_request()
    if "new" in ARGUMENTS:
        from mpkbuild import scaffold
        try:
            made = scaffold.create(root, ARGUMENTS["new"], ARGUMENTS.get("family", ""))
        except scaffold.ScaffoldError as exc:
            _fail_early(str(exc))
        print("created " + ", ".join(os.path.relpath(p, root) for p in made))
        print(f"next: scons kernel={ARGUMENTS['new']} stage=compile   (see docs/adding-a-kernel.md)")
        SCons.Script.Exit(0)
    _resolve_gpu(root)
    command = next((c for c in COMMANDS if c in SCons.Script.COMMAND_LINE_TARGETS), None)
    if command is None and "why" in ARGUMENTS:
        command = "why"
    if command is not None and "stage" not in ARGUMENTS:
        ARGUMENTS["stage"] = "review"      # status and friends look at everything by default
    names, stage = _parse_request(root)
    _STATE["wire_request"] = _wire_request()
    if GetOption("help"):
        return []
    for name in names:
        try:
            _KERNELS[name] = Kernel.load(root, name, write_cache=False)
        except spec_mod.SpecError as exc:
            _fail_early(str(exc))
    fp = _STATE["fingerprint"]
    with_summary = stage == "review" and ARGUMENTS.get("kernel", "all") == "all"
    kernels = [_KERNELS[n] for n in names]
    sconsign = status_mod.Sconsign(root)
    g = graph_mod.build(root, kernels, fp, _STATE["wire_request"], with_summary,
                        tampered=lambda rel: status_mod.tampered(root, sconsign, rel),
                        sanitize=_STATE["sanitize"])
    for node in g.nodes:
        if node.always and "modified after its gate wrote it" in node.always:
            print(f"mpk: {node.always}")
    if command is None and GetOption("no_exec") and not GetOption("clean"):
        command = "dry-run"                # plain `scons -n` under-reports; ours is exact
    if command is not None:
        SCons.Script.Exit(_report(command, g, sconsign, root, names, stage, with_summary))
    _use_cache(env, root)
    if not GetOption("clean"):
        _take_build_lock(root)
    for k in kernels:
        k.save_spec_cache()                # only now: bad input above must write nothing
    _declare(env, g)
    closure = stages.closure(stage)
    targets = g.request(names, stage, with_summary)
    needed = g.needed_labels(targets)      # the verdict table lists only what this stage builds
    requested = {}
    for k in kernels:
        if "compile" in closure:
            for arch in k.archs:
                if f"compile {k.name} {arch}" in needed:
                    requested[(k.name, "compile", f"compile {arch}")] = (
                        env.File(str(k.resources(arch))), k.resources(arch))
        for gate in stages.GPU_GATES:
            if gate in closure and f"{gate} {k.name} {g.gpu_key}" in needed:
                # the gate's own node: its check is not built when a later gate is asked for
                requested[(k.name, gate, gate)] = (env.File(str(k.gate_result(gate, g.gpu_key))),
                                                   k.gate_result(gate, g.gpu_key))
    if not targets:
        print(f"mpk: nothing to build for stage={stage} (no requested kernel has a "
              f"{'wiring section' if stage == 'wire' else 'node for it'})")
        targets = []
    if _STATE.get("default_stage_note") and not SCons.Script.COMMAND_LINE_TARGETS:
        print(f"mpk: no CUDA GPU here ({_STATE['executor'].absence()}): default stage is compile; "
              "validate/perf run on the GPU box (stage=validate here fails by design)")
    atexit.register(_verdict_table, requested)
    targets = _gpu_work_first(g, targets, kernels, closure)
    # one alias as the default target: a no-op prints one line, not one per file
    return env.Alias("mpk", [env.File(t) for t in targets])


def _gpu_work_first(g, targets: list[str], kernels: list[Kernel], closure) -> list[str]:
    """SCons hands out ready nodes in the order of its targets, so the GPU gates go first in
    the order schedule.plan makes from each gate's time last run, for as many GPUs as this
    build runs gates on at once: the longest chains start first and the GPUs finish together."""
    from mpkbuild import schedule
    gate_ids = [(k.name, gate) for gate in stages.GPU_GATES if gate in closure for k in kernels]
    by_name = {k.name: k for k in kernels}
    last = {(name, gate): g.last_elapsed.get(by_name[name].gate_result(gate, g.gpu_key), 0.0)
            for name, gate in gate_ids}
    needs = {(name, gate): [(name, d) for d in stages.BY_NAME[gate].after if d in stages.GPU_GATES]
             for name, gate in gate_ids}
    seconds = schedule.estimates(gate_ids, last, kind=lambda x: x[1])
    rank = {gate: i for i, gate in enumerate(stages.GPU_GATES)}
    ex = _STATE.get("executor")
    spares = ex.context_spares() if hasattr(ex, "context_spares") else None
    switch = None
    if spares is not None:
        count, beside = spares
        switch = schedule.context_wait(lambda x: x[1] not in beside, count, ex.context_wait_s)
    order = schedule.plan(gate_ids, seconds, needs, _gate_slots(), kind_rank=lambda x: rank[x[1]],
                          switch=switch)
    # the gate's result, not its check: a failed verdict must not stop the others
    first = [os.path.relpath(by_name[name].gate_result(gate, g.gpu_key), g.root) for name, gate in order]
    return list(dict.fromkeys(first + targets))


def _jobs() -> int:
    return int(GetOption("num_jobs") or 1)


def _gate_slots() -> int:
    """How many GPU gates run at once: -j, capped by the GPUs a local build may lease."""
    jobs = _jobs()
    gpus = getattr(_STATE.get("executor"), "gpus", None)
    if callable(gpus):
        try:
            jobs = min(jobs, max(1, len(gpus())))
        except executor_mod.ExecutorError:
            pass
    return jobs


def generate(env):
    SCons.Script.AddOption("--json", dest="mpk_json", action="store_true", default=False,
                           help="scons status: print JSON")
    env.AddMethod(declare, "MpkDeclare")


def exists(env):
    return True
