"""The GPU gates (validate, perf) and the copy-bandwidth node, as the build runs them.

What one gate is lives in one row of GATES: the runner it runs, the Python file of the
kernel it loads, the build-side judge of its figures, what it needs first, whether it can
run under compute-sanitizer or share a GPU. Its code inputs are computed from the import
closure of its runner (and judge), so an edit to any module a runner imports makes its
results stale.

A gate result records the signatures of every input it was made from (sections, library,
reference, runner code, GPU fingerprint), written atomically together with the verdict,
so a later reader can tell whether it still matches the sources. A gate that could not run
(no GPU) writes nothing: nothing is ever shown as passed that did not run.
"""
from __future__ import annotations

import datetime as _dt
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from mpkbuild.gpu import NO_GPU_HELP, GpuFingerprint
from mpkbuild.model.graph import Node, rel
from mpkbuild.model.kernel import bandwidth_file, bandwidth_rel
from mpkbuild.stages.compile import toolchain_fact
from mpkbuild.util import config
from mpkbuild.util.closure import module_files
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import (dump_json, read_json, repo_rel, sha256_bytes, sha256_or_missing,
                                  write_atomic)



@dataclass(frozen=True)
class GateKind:
    name: str
    runner: str                   # mpkbuild.runners.<runner>: the GPU side
    python_file: str | None       # the spec field naming the kernel's Python it loads
    judge: str | None = None      # build-side module whose judge() turns figures into a verdict
    needs_pass: tuple[str, ...] = ()   # gates whose verdict must be pass before it runs
    uses_bandwidth: bool = False  # reads the GPU's copy bandwidth node
    can_sanitize: bool = False    # sanitize= applies to it
    can_share_gpu: bool = False   # the spec may let it share a GPU (`share_gpu`)
    timeout_s: float | None = None  # fixed watchdog (else the spec section's timeout_s)
    uses_history: bool = False    # judged against the kernel's ledger (perf_history/)
    section: str | None = None    # the spec section with its settings (default: the gate's name)
    library: str = "harness"      # what it loads: the harness library, or the runtime's megakernel

    @property
    def settings(self) -> str:
        return self.section or self.name

    @functools.lru_cache(maxsize=None)
    def code(self) -> tuple[Path, ...]:
        """The package files whose code makes this gate's result."""
        files = set(module_files(f"mpkbuild.runners.{self.runner}"))
        if self.judge:
            files.update(module_files(self.judge))
        return tuple(sorted(files))

    @functools.lru_cache(maxsize=None)
    def code_rels(self, root: Path) -> tuple[str, ...]:
        """code(), relative to the repository at root (as the graph declares it)."""
        return tuple(rel(root, p) for p in self.code())


GATES = {
    "validate": GateKind("validate", "validate", "validate.reference", can_sanitize=True,
                         can_share_gpu=True),
    "perf": GateKind("perf", "perf", "perf.baseline", judge="mpkbuild.stages.perfcheck",
                     needs_pass=("validate",), uses_bandwidth=True, uses_history=True),
    "bandwidth": GateKind("bandwidth", "bandwidth", None, timeout_s=300),
    # the tune stage's: one candidate validated, then timed (its nodes: stages/tune.py)
    "trial": GateKind("trial", "trial", "validate.reference", uses_bandwidth=True),
    # the variants as tasks of the real MPK persistent kernel (stages/runtime.py builds it);
    # judged by validate's reference and tolerances, so it reads the validate section
    "runtime": GateKind("runtime", "runtime", "validate.reference", section="validate",
                        library="megakernel"),
}


class GateCannotRun(Exception):
    """The gate could not be run here at all (no GPU, wrong arch): nothing is recorded."""


def gpu_fact(fingerprint) -> str:
    return f"gpu: {fingerprint.signature() if fingerprint else 'none'}"


def python_file(k, kind: GateKind) -> Path:
    """The Python file of the kernel the gate's spec field names."""
    return k.root / python_rels(k, kind)[0]


def python_rels(k, kind: GateKind) -> list[str]:
    """Every Python file of the kernel the gate loads, repo-relative: the one its spec field
    names, and perf's extra baselines too."""
    section, field = kind.python_file.split(".")
    files = [k.spec.data[section][field]]
    if kind.python_file == "perf.baseline":
        files += [b["function"] for b in k.spec.data["perf"].get("baselines", [])]
    return list(dict.fromkeys(repo_rel(f.rsplit(":", 1)[0]) for f in files))


def python_files(k, kind: GateKind) -> list[Path]:
    return [k.root / rel for rel in python_rels(k, kind)]


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


def require_gpu(fingerprint: GpuFingerprint | None, absence: str, kernel: str, stage: str) -> GpuFingerprint:
    if fingerprint is None:
        raise GateCannotRun(NO_GPU_HELP.format(why=absence, kernel=kernel, stage=stage))
    return fingerprint


def written_mark(result_path: Path) -> Path:
    """Where record() keeps the digest of the result bytes it wrote."""
    result_path = Path(result_path)
    return result_path.with_name(f".{result_path.name}.written")


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


def gate_nodes(g, k, stage: str, library: str | None = None, extra_facts: tuple = ()) -> None:
    """The gate node and its check; `library`: what it loads (default: the harness's
    resources.json, which carries the library's hash)."""
    from mpkbuild import stages
    kind, row = GATES[stage], stages.BY_NAME[stage]
    key = g.gpu_key
    run_arch = config.ARCH_FOR_CC.get(g.fingerprint.cc) if g.fingerprint else None
    if library is None:
        library = k.rel.resources(run_arch if run_arch in k.archs else k.archs[0])
    result = k.rel.gate_result(stage, key)
    sources = [library, *k.rel.generated.values(), *(k.rel.section_file(s) for s in row.reads),
               *kind.code_rels(g.root), *python_rels(k, kind)]
    if kind.uses_bandwidth:
        sources.append(bandwidth_rel(key))
    sources += [k.rel.gate_verdict(gate, key) for gate in kind.needs_pass]
    facts = (gpu_fact(g.fingerprint), toolchain_fact(), *extra_facts)
    if kind.uses_history:
        from mpkbuild import history
        facts += (history.fact(g.root, key, k.name, g.files),)
    if g.sanitize and kind.can_sanitize:
        # a sanitized validate is a different gate run: its verdict says so, and a plain run redoes it
        facts += (f"sanitize: {g.sanitize}",)
    verdict = g.previous_verdict(result)
    always = None
    if verdict not in (None, "pass"):
        always = f"its last verdict was {verdict}: failures are never cached"
    elif verdict is not None and (why := g.tampered(result)):
        always = (f"{result} was modified after its gate wrote it (signature mismatch): "
                  "it is not trusted, the gate runs again") if why == "tampered" else (
                  f"{result} was written by a build that was killed before SCons "
                  "recorded it: the gate runs again")
    node = g.add(Node(f"{stage} {k.name} {key}", "gate", stage, k.name,
                      (result, k.rel.gate_verdict(stage, key), k.rel.gate_log(stage, key)),
                      tuple(sources), facts, opts=(("MPK_GATE", stage),), always=always))
    check = g.add(Node(f"check {stage} {k.name}", "check", stage, k.name,
                       (k.rel.gate_stamp(stage, key),), (node.targets[0],),
                       opts=(("MPK_GATE", stage),), silent=True))
    g.requested[(k.name, stage)] = [check.targets[0]]


def shared_nodes(g, kernels, with_summary: bool) -> None:
    """The GPU's copy bandwidth: one node per GPU profile, first in the graph."""
    g.nodes.insert(0, Node(f"bandwidth {g.gpu_key}", "bandwidth", "perf", None,
                           (bandwidth_rel(g.gpu_key),),
                           GATES["bandwidth"].code_rels(g.root),
                           (gpu_fact(g.fingerprint),)))


def predict(node, k, predictor) -> dict:
    """A gate is assumed to keep its verdict: the verdict word and the stamp stay put."""
    keep = [t for t in node.targets if t.endswith((".verdict", ".ok"))]
    from mpkbuild.status import CHANGED
    return {t: CHANGED for t in node.targets if t not in keep}


# ---------------------------------------------------------------- actions
def run_bandwidth(build, info, target, source) -> int:
    from mpkbuild.run.job import GateJob
    root = build.root
    job = GateJob("bandwidth", "-", {"root": str(root)}, Path(target[0].abspath).parent,
                  timeout_s=GATES["bandwidth"].timeout_s, root=root)
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


def run_gate(build, info, target, source) -> int:
    from mpkbuild.run.job import GateJob
    k = build.kernels[info["MPK_KERNEL"]]
    gate = info["MPK_GATE"]
    kind = GATES[gate]
    try:
        fp = build.ready_gpu(k.name, gate)
        arch = arch_for(fp, k.archs, k.name)
    except GateCannotRun as exc:
        return build.fail(str(exc))
    library = k.library(arch)
    payload = {"root": str(k.root), "library": str(library),
               "codegen": read_json(k.section_file("codegen")),
               "generators": read_json(k.section_file("generators")),
               kind.settings: read_json(k.section_file(kind.settings))}
    if kind.library == "megakernel":
        from mpkbuild.stages import runtime
        library = runtime.library_path(k, arch)
        payload.update(library=str(library), runtime=runtime.job_payload(k, build))
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
        inputs = [library, *python_files(k, kind)]
        if kind.uses_bandwidth:
            payload["bandwidth_file"] = str(bandwidth_file(k.root, fp.key))
            inputs.append(bandwidth_file(k.root, fp.key))
        section = payload[kind.settings][kind.settings]
        job = GateJob(
            gate, k.name, payload, workdir, section["timeout_s"], root=k.root,
            inputs=tuple(dict.fromkeys(os.path.relpath(p, k.root) for p in inputs)),
            sanitize=build.sanitize if kind.can_sanitize else None,
            share_gpu=kind.can_share_gpu and bool(section.get("share_gpu", False)))
        try:
            result = build.run_gate(job)
        except GateCannotRun as exc:
            return build.fail(str(exc))
        if kind.judge:      # the runners time; the verdict is made here, the same for every executor
            import importlib
            extra = {}
            if kind.uses_history:
                from mpkbuild import history
                extra = {"history": history.last_entry(k.root, fp.key, k.name)}
                if "max_regression" in section:
                    extra["max_regression"] = section["max_regression"]
            result = importlib.import_module(kind.judge).judge(
                result, section["thresholds"], list(payload["codegen"]["codegen"]["variants"]), **extra)
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
