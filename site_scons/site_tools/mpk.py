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

from mpkbuild import codegen, config, gates, review, stages, wirestage
from mpkbuild import compile as nvcc
from mpkbuild import executor as executor_mod
from mpkbuild import spec as spec_mod
from mpkbuild.kernel import Kernel, bandwidth_file, discover, summary_file

PKG = config.PACKAGE_DIR
_KERNELS: dict[str, Kernel] = {}
_STATE: dict = {}


def _label(stage: str, kernel: str, detail: str = "") -> str:
    return f"{stage:<9} {kernel}" + (f" {detail}" if detail else "")


def _fail(message: str) -> int:
    sys.stderr.write(f"mpk: error: {message}\n")
    return 1


# ---------------------------------------------------------------- actions
def _spec_action(target, source, env):
    k = _KERNELS[env["MPK_KERNEL"]]
    from mpkbuild.fsutil import write_json_atomic
    for name, section in k.spec.sections.items():
        write_json_atomic(k.section_file(name), section)
    write_json_atomic(k.spec_json, {"file": k.spec.file, "spec": k.spec.data,
                                    "signatures": k.spec.signatures})
    return 0


def _generate_action(target, source, env):
    k = _KERNELS[env["MPK_KERNEL"]]
    section = gates.read_result(k.section_file("codegen"))
    try:
        codegen.generate_file(env["MPK_ROLE"], section, k.spec.file, k.body_source, k.root,
                              Path(target[0].abspath))
    except codegen.TemplateError as exc:
        return _fail(str(exc))
    return 0


def _compile_action(target, source, env):
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


def _lock_for(source, root: Path, fingerprint) -> dict:
    items = []
    for node in source:
        if isinstance(node, SCons.Node.FS.File):
            items.append((os.path.relpath(node.abspath, root), Path(node.abspath)))
        else:
            items.append((f"value:{node}", str(node.read())))
    items.append(("gpu", fingerprint.signature()))
    return gates.input_lock(root, items)


def _ready_gpu(kernel_name: str, stage: str):
    ex = _STATE["executor"]
    return gates.require_gpu(_STATE["fingerprint"], ex.absence(), kernel_name, stage)


def _bandwidth_action(target, source, env):
    root = Path(env["MPK_ROOT"])
    try:
        fp = _ready_gpu("all", "perf")
    except gates.GateCannotRun as exc:
        return _fail(str(exc))
    job = executor_mod.GateJob("bandwidth", "-", {"root": str(root)},
                               Path(target[0].abspath).parent, timeout_s=300)
    result = _STATE["executor"].run(job)
    full = gates.record(result, gate="bandwidth", kernel="-", fingerprint=fp,
                        lock=_lock_for(source, root, fp), result_path=Path(target[0].abspath),
                        verdict_path=None)
    if full["verdict"] != "pass":
        Path(target[0].abspath).unlink(missing_ok=True)
        return _fail(f"copy-bandwidth measurement failed: {gates.verdict_line(full)}")
    print(f"          {full['message']}")
    return 0


def _gate_action(target, source, env):
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
    if gate == "perf":
        payload["bandwidth_file"] = str(bandwidth_file(k.root, fp.key))
        if (Path(target[0].abspath).parent / "validate.verdict").read_text().strip() != "pass":
            result = {"verdict": "blocked", "message": "not run: validate did not pass on this GPU"}
            gates.record(result, gate=gate, kernel=k.name, fingerprint=fp,
                         lock=_lock_for(source, k.root, fp), result_path=Path(target[0].abspath),
                         verdict_path=Path(target[1].abspath))
            return 0
    timeout = payload[gate][gate]["timeout_s"]
    job = executor_mod.GateJob(gate, k.name, payload, Path(target[0].abspath).parent, timeout)
    result = _STATE["executor"].run(job)
    full = gates.record(result, gate=gate, kernel=k.name, fingerprint=fp,
                        lock=_lock_for(source, k.root, fp), result_path=Path(target[0].abspath),
                        verdict_path=Path(target[1].abspath))
    print(f"          {gate} {k.name}: {gates.verdict_line(full)} ({full.get('elapsed_s', '?')} s)")
    return 0


def _check_action(target, source, env):
    """The exit status of a gate: fails (and is re-checked next run) unless the verdict is pass."""
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
    k = _KERNELS[env["MPK_KERNEL"]]
    key = env["MPK_GPU_KEY"]
    data = review.kernel_review(
        k.name, k.build_dir, k.archs, key, {a: k.resources(a) for a in k.archs},
        {g: k.gate_result(g, key) for g in stages.GPU_GATES},
        k.wire_result if k.has_wiring else None)
    try:
        review.write_kernel_review(data, Path(target[0].abspath), Path(target[1].abspath))
    except codegen.TemplateError as exc:
        return _fail(str(exc))
    return 0


def _summary_action(target, source, env):
    review.write_summary([Path(s.abspath) for s in source if s.abspath.endswith(".json")],
                         Path(target[0].abspath))
    return 0


def _action(fn, label_fn, varlist=()):
    return SCons.Action.Action(fn, strfunction=label_fn, varlist=list(varlist))


_SPEC = _action(_spec_action, lambda t, s, e: _label("spec", e["MPK_KERNEL"]), ["MPK_KERNEL"])
_GENERATE = _action(_generate_action,
                    lambda t, s, e: _label("generate", e["MPK_KERNEL"], Path(str(t[0])).name),
                    ["MPK_KERNEL", "MPK_ROLE"])
_COMPILE = _action(_compile_action, lambda t, s, e: _label("compile", e["MPK_KERNEL"], e["MPK_ARCH"]),
                   ["MPK_KERNEL", "MPK_ARCH", "MPK_NVCC_CMD"])
_BANDWIDTH = _action(_bandwidth_action, lambda t, s, e: _label("bandwidth", e["MPK_GPU_KEY"]),
                     ["MPK_GPU_KEY"])
_GATE = _action(_gate_action, lambda t, s, e: _label(e["MPK_GATE"], e["MPK_KERNEL"], e["MPK_GPU_KEY"]),
                ["MPK_KERNEL", "MPK_GATE", "MPK_GPU_KEY"])
_WIRE = _action(_wire_action, lambda t, s, e: _label("wire", e["MPK_KERNEL"]), ["MPK_KERNEL"])
_CHECK = _action(_check_action, lambda t, s, e: None, ["MPK_KERNEL", "MPK_GATE"])
_REVIEW = _action(_review_action, lambda t, s, e: _label("review", e["MPK_KERNEL"]),
                  ["MPK_KERNEL", "MPK_GPU_KEY"])
_SUMMARY = _action(_summary_action, lambda t, s, e: _label("review", "summary"))


# ---------------------------------------------------------------- declaration
def _declare_kernel(env, k: Kernel, gpu_key: str, fingerprint_value, nvcc_value) -> dict:
    """Declare one kernel's nodes; returns stage name -> the nodes that stage's request builds."""
    e = env.Clone(MPK_KERNEL=k.name, MPK_GPU_KEY=gpu_key)
    out: dict[str, list] = {}

    sections = [k.section_file(name) for name in k.spec.sections]
    spec_nodes = e.Command([str(k.spec_json)] + [str(p) for p in sections],
                           [str(k.spec_file), str(PKG / "spec.py"), str(PKG / "schema.py"),
                            str(PKG / "yamlpos.py")], _SPEC)
    out["spec"] = spec_nodes
    section_node = {name: e.File(str(k.section_file(name))) for name in k.spec.sections}

    gen_sources = {
        "spec_header": [section_node["codegen"], str(PKG / "templates" / "spec_header.h.j2")],
        "harness": [section_node["codegen"], str(PKG / "templates" / "harness.cu.j2")],
        "body": ([section_node["codegen"]] if k.body_is_template else []) + [str(k.body_source)],
    }
    generated = []
    for role, path in k.generated.items():
        generated += e.Command(str(path), gen_sources[role] + [str(PKG / "codegen.py")],
                               _GENERATE, MPK_ROLE=role)
    out["generate"] = generated

    out["compile"] = []
    libraries = {}
    for arch in k.archs:
        # root-relative paths: the action's signature must not change when the tree moves
        rel = lambda p: os.path.relpath(p, k.root)
        cmd = nvcc.nvcc_command(arch, rel(k.generated["harness"]), rel(k.gen_dir), rel(k.library(arch)))
        nodes = e.Command([str(k.library(arch)), str(k.resources(arch))],
                          generated + [nvcc_value, str(PKG / "compile.py")], _COMPILE,
                          MPK_ARCH=arch, MPK_NVCC_CMD=cmd)
        e.SideEffect(str(k.arch_dir(arch) / "compile.log"), nodes)
        libraries[arch] = nodes[0]
        out["compile"] += nodes

    out["wire"] = []
    if k.has_wiring:
        request = _STATE["wire_request"]
        wiring_files = sorted(str(p) for p in (k.root / "wiring").rglob("*") if p.is_file())
        wire_pkg = sorted(str(p) for p in (PKG / "wire").glob("*.py"))
        nodes = e.Command(str(k.wire_result),
                          [section_node["wiring"], section_node["codegen"], e.Value(request.describe()),
                           str(PKG / "wirestage.py")] + wiring_files + wire_pkg, _WIRE)
        # one kernel at a time edits a checkout; the checkout lives outside this tree and
        # can change under us, so with mpk_root= the stage always re-plans (it is cheap)
        e.SideEffect(str(k.root / config.BUILD_DIRNAME / ".wire-in-use"), nodes)
        if request.mpk_root is not None:
            e.AlwaysBuild(nodes)
        out["wire"] = nodes

    fp = _STATE["fingerprint"]
    run_arch = config.ARCH_FOR_CC.get(fp.cc) if fp else None
    library = libraries.get(run_arch) or libraries[k.archs[0]]
    gpu_lock = str(k.root / config.BUILD_DIRNAME / "gpu" / gpu_key / ".gpu-in-use")
    results = {}
    for gate in stages.GPU_GATES:
        row = stages.BY_NAME[gate]
        sources = [library, fingerprint_value] + [section_node[s] for s in row.reads]
        sources += [str(p) for p in gates.runner_files(gate)]
        sources += [str(k.reference_file if gate == "validate" else k.baseline_file)]
        if gate == "perf":
            sources += [str(bandwidth_file(k.root, gpu_key)), str(k.gpu_dir(gpu_key) / "validate.verdict")]
        result = k.gate_result(gate, gpu_key)
        nodes = e.Command([str(result), str(result.with_suffix(".verdict"))], sources, _GATE,
                          MPK_GATE=gate)
        e.SideEffect(str(k.gate_log(gate, gpu_key)), nodes)
        e.SideEffect(gpu_lock, nodes)   # one GPU gate at a time on this machine's GPU
        previous = gates.read_result(result)
        if previous is not None and previous.get("verdict") != "pass":
            e.AlwaysBuild(nodes)        # failures are never cached: the gate runs again
        check = e.Command(str(k.gate_stamp(gate, gpu_key)), str(result), _CHECK, MPK_GATE=gate)
        results[gate] = result
        out[gate] = check
    review_nodes = e.Command([str(k.review), str(k.review.with_suffix(".json"))],
                             [str(k.resources(a)) for a in k.archs] + [str(p) for p in results.values()]
                             + [str(k.wire_result)] * k.has_wiring
                             + [str(PKG / "review.py"), str(PKG / "templates" / "review.md.j2")],
                             _REVIEW)
    out["review"] = review_nodes + out["validate"] + out["perf"]
    out["_review_json"] = review_nodes[1]
    e.Clean(spec_nodes, str(k.build_dir))
    return out


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
        stage = "review" if _STATE["fingerprint"] is not None else "compile"
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
             "[executor=local|module:Class] [-n] [-c] [-jN]",
             "       scons stage=wire mpk_root=PATH [apply=1] [unwire=1]   registration edits",
             "", "stages (stage= builds the stage and everything it needs; default: review "
             "with a GPU, compile without):"]
    for s in stages.STAGES:
        lines.append(f"  {s.name:<9} {s.doc}{'  [GPU]' if s.needs_gpu else ''}")
    lines += ["", "kernels: " + (", ".join(discover(root)) or "none"), ""]
    return "\n".join(lines)


def _verdict_table(requested: dict) -> None:
    """Printed at exit: every requested gate's verdict, from this run's nodes and results."""
    if GetOption("no_exec") or GetOption("clean") or GetOption("help"):
        return
    rows = []
    for (kname, gate, label), (node, result_path) in requested.items():
        state = node.get_state()
        if state == SCons.Node.failed:
            res = gates.read_result(result_path) if result_path else None
            verdict = gates.verdict_line(res) if res else "FAILED (see the error above)"
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


def declare(env) -> list:
    """Declare everything the command line asks for; returns the default targets."""
    root = Path(env.Dir("#").abspath)
    env["MPK_ROOT"] = str(root)
    SCons.Script.Help(_help_text(root), append=False)
    try:
        _STATE["executor"] = executor_mod.load(ARGUMENTS.get("executor"))
    except (ValueError, ImportError, AttributeError) as exc:
        _fail_early(f"executor: {exc}")
    _STATE["fingerprint"] = _STATE["executor"].fingerprint()
    names, stage = _parse_request(root)
    _STATE["wire_request"] = _wire_request()
    if GetOption("help"):
        return []
    for name in names:
        try:
            _KERNELS[name] = Kernel.load(root, name)
        except spec_mod.SpecError as exc:
            _fail_early(str(exc))
    fp = _STATE["fingerprint"]
    gpu_key = fp.key if fp else "no-gpu"
    fingerprint_value = env.Value(fp.signature() if fp else "gpu=none")
    nvcc_value = env.Value(nvcc.toolchain_fingerprint())
    bw = env.Command(str(bandwidth_file(root, gpu_key)),
                     [fingerprint_value] + [str(p) for p in gates.runner_files("bandwidth")],
                     _BANDWIDTH, MPK_GPU_KEY=gpu_key)
    env.SideEffect(str(root / config.BUILD_DIRNAME / "gpu" / gpu_key / ".gpu-in-use"), bw)
    targets, requested, review_jsons = [], {}, []
    closure = stages.closure(stage)
    for name in names:
        k = _KERNELS[name]
        nodes = _declare_kernel(env, k, gpu_key, fingerprint_value, nvcc_value)
        targets += nodes[stage]
        review_jsons.append(nodes["_review_json"])
        if "compile" in closure:
            for arch in k.archs:
                requested[(name, "compile", f"compile {arch}")] = (
                    env.File(str(k.resources(arch))), k.resources(arch))
        for gate in stages.GPU_GATES:
            if gate in closure:
                requested[(name, gate, gate)] = (env.File(str(k.gate_stamp(gate, gpu_key))),
                                                 k.gate_result(gate, gpu_key))
    if stage == "review" and ARGUMENTS.get("kernel", "all") == "all" and review_jsons:
        targets += env.Command(str(summary_file(root)), review_jsons
                               + [str(PKG / "review.py"), str(PKG / "templates" / "summary.md.j2")],
                               _SUMMARY)
    if not targets:
        print(f"mpk: nothing to build for stage={stage} (no requested kernel has a "
              f"{'wiring section' if stage == 'wire' else 'node for it'})")
        targets = [env.Alias("mpk-nothing-to-do")]
    if _STATE.get("default_stage_note") and not SCons.Script.COMMAND_LINE_TARGETS:
        print(f"mpk: no CUDA GPU here ({_STATE['executor'].absence()}): default stage is compile; "
              "validate/perf run on the GPU box (stage=validate here fails by design)")
    atexit.register(_verdict_table, requested)
    return targets


def generate(env):
    env.AddMethod(declare, "MpkDeclare")


def exists(env):
    return True
