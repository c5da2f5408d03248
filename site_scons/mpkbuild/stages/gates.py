"""The GPU gates (validate, perf, and the runtime gate's run) and the copy-bandwidth node,
as the build runs them.

What one gate is lives in its stage's row (stages/table.py, `gate=`): the runner it runs, the
Python file of the kernel it loads, the build-side judge of its figures, what it needs
first, whether it can run under compute-sanitizer or share a GPU. Its code input is the
`code:` fact of its stage (the import closure of this module, its runner and its judge).

A gate result records the signatures of every input it was made from (sections, library,
reference, code, GPU fingerprint), written atomically together with the verdict, so a later
reader can tell whether it still matches the sources. A gate that could not run (no GPU)
writes nothing: nothing is ever shown as passed that did not run.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import os
from pathlib import Path

from mpkbuild.stages import table as stages
from mpkbuild.stages.table import BANDWIDTH  # noqa: F401 (perf's bandwidth node runs it here)
from mpkbuild.gpu import NO_GPU_HELP, GpuFingerprint
from mpkbuild.model.graph import CHANGED, Node
from mpkbuild.model.paths import bandwidth_file, bandwidth_rel
from mpkbuild.runners import facts
from mpkbuild.util.expr import variant_facts
from mpkbuild.util.toolchain import toolchain_fact
from mpkbuild.util import config
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import (dump_json, read_json, repo_rel, sha256_bytes, sha256_or_missing,
                                  write_atomic, written_mark)


class GateCannotRun(Exception):
    """The gate could not be run here at all (no GPU, wrong arch): nothing is recorded."""


def gpu_fact(fingerprint) -> str:
    return f"gpu: {fingerprint.signature() if fingerprint else 'none'}"


def python_file(k, gate: stages.Gate) -> Path:
    """The Python file of the kernel the gate's spec field names."""
    return k.root / python_rels(k, gate)[0]


def python_rels(k, gate: stages.Gate) -> list[str]:
    """Every Python file of the kernel the gate loads, repo-relative: the one its spec field
    names, and perf's extra baselines too; none for a gate that loads no Python of the
    kernel's (the profile gate)."""
    if gate.python_file is None:
        return []
    section, field = gate.python_file.split(".")
    files = [k.spec.data[section][field]]
    if gate.python_file == "perf.baseline":
        files += [b["function"] for b in k.spec.data["perf"].get("baselines", [])]
    return list(dict.fromkeys(repo_rel(f.rsplit(":", 1)[0]) for f in files))


def python_files(k, gate: stages.Gate) -> list[Path]:
    return [k.root / rel for rel in python_rels(k, gate)]


def input_lock(root: Path, sources: list[tuple[str, str | Path]]) -> dict:
    """{name: sha256} for files, {name: value} for facts. Names are repo-relative."""
    lock = {}
    for name, item in sources:
        lock[name] = sha256_or_missing(item) if isinstance(item, Path) else item
    return lock


def lock_for(source, root: Path, fingerprint=None) -> dict:
    """{input: signature} for an action's SCons sources (files hashed, facts verbatim)."""
    import SCons.Node.FS
    items = []
    for node in source:
        if isinstance(node, SCons.Node.FS.File):
            items.append((os.path.relpath(node.abspath, root), Path(node.abspath)))
        else:
            items.append((f"value:{node}", str(node.read())))
    if fingerprint is not None:
        items.append(("gpu", fingerprint.signature()))
    return input_lock(root, items)


def arch_for(fingerprint: GpuFingerprint, archs: tuple[str, ...], kernel: str) -> str:
    arch = config.ARCH_FOR_CC.get(fingerprint.cc)
    if arch is None or arch not in archs:
        raise GateCannotRun(
            f"{kernel}: this GPU ({fingerprint.name}, compute capability "
            f"{fingerprint.compute_capability}) runs {arch or 'no supported arch'}, and the "
            f"spec targets {', '.join(archs)}")
    return arch


def waits_for(fingerprint, archs) -> str | None:
    """Why a kernel's GPU gates cannot run on this GPU profile at all (its arch is none of
    the spec's): they wait for that hardware, "pending TIER-1", never passed, never an error."""
    if fingerprint is None:
        return None
    arch = config.ARCH_FOR_CC.get(fingerprint.cc)
    if arch in archs:
        return None
    return (f"pending TIER-1 (needs {' or '.join(sorted(archs))}): GPU profile {fingerprint.key} "
            f"runs {arch or 'no arch the tool builds for'}")


def waiting_node(g, k, stage: str, kind: str, targets: tuple) -> bool:
    """Where this GPU profile's arch is none of the spec's, the stage's one node waits for
    that hardware (pending TIER-1: never declared to SCons, nothing requested of it) and
    this is True; else False and the stage declares its nodes as usual."""
    waits = waits_for(g.fingerprint, k.archs)
    if waits:
        g.add(Node(f"{stage} {k.name} {g.gpu_key}", kind, stage, k.name, targets, (), column=stage,
                   on_gpu=True, waits=waits))
        g.waiting.setdefault(k.name, {})[stage] = waits
        g.requested[(k.name, stage)] = []
    return bool(waits)


def require_gpu(fingerprint: GpuFingerprint | None, absence: str, kernel: str, stage: str,
                args: str = "") -> GpuFingerprint:
    """args: what the command that works needs besides kernel= and stage= (mpk_root=)."""
    if fingerprint is None:
        raise GateCannotRun(NO_GPU_HELP.format(why=absence, kernel=kernel, stage=stage, args=args))
    return fingerprint


def record(result: dict, *, gate: str, kernel: str, fingerprint: GpuFingerprint, lock: dict,
           result_path: Path, verdict_path: Path | None) -> dict:
    """Write result + verdict files (each atomic); the verdict file holds only the word."""
    device = result.get("device", {})
    if device and device.get("name") and device["name"] != fingerprint.name:
        result = {"verdict": "crash", "message":
                  f"runner saw GPU {device['name']!r}, the build expected {fingerprint.name!r}"}
    full = {"gate": gate, "kernel": kernel, **result, "gpu": fingerprint.to_json(),
            "gpu_signature": fingerprint.signature(), "inputs": lock,
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    text = dump_json(full)
    # the bytes' digest beside them, written before the result: a result SCons never
    # recorded (the build was killed before it wrote .sconsign) is then told from one
    # edited by hand (status.tampered)
    write_atomic(written_mark(result_path), sha256_bytes(text.encode()) + "\n")
    write_atomic(result_path, text)
    if verdict_path is not None:
        write_atomic(verdict_path, full["verdict"] + "\n", only_if_changed=True)
    return full


def verdict_line(result: dict) -> str:
    msg = (result.get("message") or "").strip().splitlines()
    return f"{result.get('verdict', '?')}: {msg[0] if msg else ''}".rstrip(": ")


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    """One gate node (result, verdict word, log) and its silent check node per GPU gate."""
    gate_nodes(g, k, stage)


def gate_nodes(g, k, stage: str, library: str | None = None, extra_facts: tuple = (),
               extra_sources=()) -> None:
    """The gate node and its check; `library`: what it loads (default: the harness's
    resources.json, which carries the library's hash); `extra_sources`: what else its run
    reads (the runtime gate: the inputs and references of the kernels its blocks run)."""
    row = stages.BY_NAME[stage]
    kind = row.gate
    key = g.gpu_key
    if waiting_node(g, k, stage, "gate", (k.rel.gate_result(stage, key), k.rel.gate_verdict(stage, key),
                                          k.rel.gate_log(stage, key))):
        return
    run_arch = config.ARCH_FOR_CC.get(g.fingerprint.cc) if g.fingerprint else None
    if library is None:
        library = k.rel.resources(run_arch if run_arch in k.archs else k.archs[0])
    result = k.rel.gate_result(stage, key)
    sources = [library, *k.rel.generated.values(), *(k.rel.section_file(s) for s in row.reads),
               *python_rels(k, kind), *extra_sources]
    if kind.uses_bandwidth:
        sources.append(bandwidth_rel(key))
    sources += [k.rel.gate_verdict(gate, key) for gate in kind.needs_pass]
    facts = (gpu_fact(g.fingerprint), toolchain_fact(), g.stage_code(stage), *extra_facts)
    if kind.ledger:     # by name: only the gate judged against a ledger has its code
        facts += (importlib.import_module(kind.ledger).fact(g.root, key, k.name, g.files),)
    if g.sanitize and kind.can_sanitize:
        # a sanitized validate is a different gate run: its verdict says so, and a plain run redoes it
        facts += (f"sanitize: {g.sanitize}",)
    verdict = g.previous_verdict(result)
    always = None
    if verdict not in (None, "pass"):
        always = f"its last verdict was {verdict}: failures are never cached"
    elif verdict is not None and (why := g.tampered(result)):
        always = g.distrust(f"{result} was modified after its gate wrote it (signature mismatch): "
                            "it is not trusted, the gate runs again") if why == "tampered" else (
                  f"{result} was written by a build that was killed before SCons "
                  "recorded it: the gate runs again")
    node = g.add(Node(f"{stage} {k.name} {key}", "gate", stage, k.name,
                      (result, k.rel.gate_verdict(stage, key), k.rel.gate_log(stage, key)),
                      tuple(sources), facts, opts=(("MPK_GATE", stage),), always=always,
                      verdict_at=0, column=stage, on_gpu=True, reported=True))
    check = g.add(Node(f"check {stage} {k.name}", "check", stage, k.name,
                       (k.rel.gate_stamp(stage, key),), (node.targets[0],),
                       opts=(("MPK_GATE", stage),), silent=True, column="check"))
    g.requested[(k.name, stage)] = [check.targets[0]]


def predict(node, k, predictor) -> dict:
    """A gate is assumed to keep its verdict: the verdict word and the stamp stay put."""
    keep = [t for t in node.targets if t.endswith((".verdict", ".ok"))]
    return {t: CHANGED for t in node.targets if t not in keep}


# ---------------------------------------------------------------- actions
def run_bandwidth(build, info, target, source) -> int:
    from mpkbuild.run.job import GateJob
    root = build.root
    job = GateJob("bandwidth", "-", {"root": str(root)}, Path(target[0].abspath).parent,
                  timeout_s=BANDWIDTH.timeout_s, root=root, preload=stages.runner_names())
    try:
        fp = build.ready_gpu("all", "perf")
        result = build.run_gate(job)
    except GateCannotRun as exc:
        return build.fail(str(exc))
    full = record(result, gate="bandwidth", kernel="-", fingerprint=fp,
                  lock=lock_for(source, root, fp), result_path=Path(target[0].abspath),
                  verdict_path=None)
    if full["verdict"] != "pass":
        Path(target[0].abspath).unlink(missing_ok=True)
        return build.fail(f"copy-bandwidth measurement failed: {verdict_line(full)}")
    say(f"          {full['message']}")
    return 0


def wrapper_for(kind: stages.Gate, sanitize: str | None) -> tuple[str, str] | None:
    """The tool a gate's runner runs under: its own (the profile stage's ncu), else
    compute-sanitizer where sanitize= asks and the gate takes it."""
    if kind.wrapper:
        return kind.wrapper
    return ("mpkbuild.run.sanitizer", sanitize) if sanitize and kind.can_sanitize else None


def run_gate(build, info, target, source) -> int:
    from mpkbuild.run.job import GateJob
    k = build.kernels[info["MPK_KERNEL"]]
    gate = info["MPK_GATE"]
    row = stages.BY_NAME[gate]
    kind = row.gate
    try:
        fp = build.ready_gpu(k.name, gate)
        arch = arch_for(fp, k.archs, k.name)
    except GateCannotRun as exc:
        return build.fail(str(exc))
    library = k.library(arch)
    codegen = read_json(k.section_file("codegen"))
    perf = read_json(k.section_file("perf"))["perf"] if "perf" in row.reads else None
    payload = {"root": str(k.root), "library": str(library), "codegen": codegen,
               "generators": read_json(k.section_file("generators")),
               row.settings: read_json(k.section_file(row.settings)),
               facts.KEY: variant_facts(codegen["codegen"], perf)}
    # a stage whose gate loads something else than the harness library says what, and adds
    # to the job (the runtime gate: its megakernel, the graphs, the other kernels' Python)
    more = []
    if kind.job:
        module, function = kind.job.split(":")
        library, more = getattr(importlib.import_module(module), function)(k, build, arch, payload)
    workdir = Path(target[0].abspath).parent
    blocked = [g for g in kind.needs_pass
               if (workdir / f"{g}.verdict").read_text().strip() != "pass"]
    if blocked:
        result = {"verdict": "blocked", "message": f"not run: {blocked[0]} did not pass on this GPU"}
    elif build.failed_gate and not build.keep_going:
        # gates are handed out before their checks: keep SCons's stop-at-first-failure
        return build.fail(f"{gate} {k.name}: not run, {build.failed_gate} did not pass "
                          "(-k runs every gate)")
    else:
        inputs = [library, *python_files(k, kind), *more]
        if kind.uses_bandwidth:
            payload["bandwidth_file"] = str(bandwidth_file(k.root, fp.key))
            inputs.append(bandwidth_file(k.root, fp.key))
        section = payload[row.settings][row.settings]
        job = GateJob(
            gate, k.name, payload, workdir, section["timeout_s"], root=k.root,
            inputs=tuple(dict.fromkeys(os.path.relpath(p, k.root) for p in inputs)),
            wrapper=wrapper_for(kind, build.sanitize),
            share_gpu=kind.can_share_gpu and bool(section.get("share_gpu", False)),
            preload=stages.runner_names())
        try:
            result = build.run_gate(job)
        except GateCannotRun as exc:
            return build.fail(str(exc))
        if kind.judge:      # the runners time; the verdict is made here, the same for every executor
            extra = {}
            if kind.ledger:
                extra = {"history": importlib.import_module(kind.ledger).last_entry(k.root, fp.key, k.name)}
                if "max_regression" in section:
                    extra["max_regression"] = section["max_regression"]
            rules = (read_json(k.section_file(kind.thresholds))[kind.thresholds] if kind.thresholds
                     else section)["thresholds"]
            judge = importlib.import_module(kind.judge)
            names = judge.expected(k.spec.data, payload)
            result = judge.judge(result, rules, names, **extra)
    full = record(result, gate=gate, kernel=k.name, fingerprint=fp,
                  lock=lock_for(source, k.root, fp), result_path=Path(target[0].abspath),
                  verdict_path=Path(target[1].abspath))
    say(f"          {gate} {k.name}: {verdict_line(full)} ({full.get('elapsed_s', '?')} s)")
    if full["verdict"] not in ("pass", "blocked"):
        build.failed_gate = f"{gate} {k.name}"
    return 0


def run_check(build, info, target, source) -> int:
    """The exit status of a gate: fails (and is re-checked next run) unless the verdict is pass."""
    res = read_json(Path(source[0].abspath))
    stamp = Path(target[0].abspath)
    if res and res.get("verdict") == "pass":
        stamp.write_text("pass\n")
        return 0
    stamp.unlink(missing_ok=True)
    log = Path(source[0].abspath).with_suffix(".log")
    return build.fail(f"{info['MPK_GATE']} {info['MPK_KERNEL']}: "
                      f"{verdict_line(res) if res else 'no result'}\n  result: {source[0]}  log: "
                      f"{os.path.relpath(log, build.root)}")


ACTIONS = {"gate": run_gate, "bandwidth": run_bandwidth, "check": run_check}
