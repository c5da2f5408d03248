"""The compile stage: nvcc per target arch, ptxas resources parsed, the resource gate.

The library and resources.json are written atomically. A spill or an SMEM plan over the
budget fails the gate with the numbers, and no library is left behind for a later stage to
trust. The nvcc version and every flag are part of the stage's signature (see
:func:`toolchain_fingerprint` and :func:`nvcc_command`).
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.util.toolchain import toolchain_fact, toolchain_fingerprint  # noqa: F401 (re-exported)
from mpkbuild.model.graph import Node
from mpkbuild.util.fsutil import sha256_file, write_atomic, write_json_atomic


class CompileError(Exception):
    """nvcc failed, or the resource gate failed; the message carries nvcc's output or the numbers."""


def gencode(arch: str) -> str:
    num = arch[len("sm_"):]
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def nvcc_command(arch: str, harness: Path, include_dir: Path, output: Path,
                 extra_flags: tuple[str, ...] = ()) -> list[str]:
    return ["nvcc", *config.NVCC_BASE_FLAGS, gencode(arch), f"-I{include_dir}",
            *extra_flags, "-o", str(output), str(harness)]


_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(\w+)'")
_FUNCTION = re.compile(r"Function properties for (\S+)")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes cumulative stack size)?"
                   r"(?:, (\d+) bytes smem)?")


def parse_ptxas(text: str) -> dict[str, dict]:
    """Per function ptxas reports (mangled name): registers, barriers, static smem, stack,
    spills; `entry` False for a function the entries call (one not inlined: a task body that
    is its own function), whose stack and spills ptxas lists after its caller's, by name."""
    out: dict[str, dict] = {}
    entry = props = None

    def function(name: str, arch: str, is_entry: bool) -> dict:
        return out.setdefault(name, {"arch": arch, "entry": is_entry, "registers": 0, "barriers": 0,
                                     "static_smem": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0})

    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            entry = props = function(m.group(1), m.group(2), True)
            continue
        m = _FUNCTION.search(line)
        if m:      # the entry's own (already kept) or a function it calls
            props = function(m.group(1), entry["arch"] if entry is not None else "", False)
            continue
        m = _PROPS.search(line)
        if m and props is not None:
            props.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                         spill_loads=int(m.group(3)))
            continue
        m = _USED.search(line)
        if m and entry is not None:
            # the entry's registers and its stack with its callees' frames (cumulative)
            entry.update(registers=int(m.group(1)), barriers=int(m.group(2) or 0),
                         static_smem=int(m.group(4) or 0))
            if m.group(3):
                entry["stack"] = max(entry["stack"], int(m.group(3)))
    return out


def variant_of(mangled: str, kernel: str, variants) -> str | None:
    for v in variants:
        name = f"{kernel}__{v}"
        if f"{len(name)}{name}" in mangled:
            return v
    return None


@dataclass(frozen=True)
class CompileJob:
    kernel: str
    arch: str
    variants: tuple[str, ...]
    harness: Path
    library: Path
    resources: Path
    log: Path
    smem_total: int
    smem_budget: int


def resource_verdict(job: CompileJob, functions: dict[str, dict]) -> dict:
    """Gate the ptxas numbers: no spills, SMEM (static + planned dynamic) within budget."""
    per_variant, problems = {}, []
    for mangled, info in functions.items():
        if not info["entry"]:
            # a function the variants' entries call: its spills are theirs, wherever it runs
            if info["spill_stores"] or info["spill_loads"]:
                problems.append(f"{mangled} (called, not inlined): spills {info['spill_stores']} bytes "
                                f"stored / {info['spill_loads']} bytes loaded")
            continue
        variant = variant_of(mangled, job.kernel, job.variants)
        if variant is None:
            continue
        smem = info["static_smem"] + job.smem_total
        per_variant[variant] = {**info, "dynamic_smem": job.smem_total, "smem_total": smem}
        if info["spill_stores"] or info["spill_loads"]:
            problems.append(f"{variant}: spills {info['spill_stores']} bytes stored / "
                            f"{info['spill_loads']} bytes loaded ({info['registers']} registers)")
        if smem > job.smem_budget:
            problems.append(f"{variant}: SMEM {smem} bytes (static {info['static_smem']} + planned "
                            f"{job.smem_total}) > budget {job.smem_budget}")
    missing = sorted(set(job.variants) - set(per_variant))
    if missing:
        problems.append(f"ptxas reported no entry function for variants {', '.join(missing)}")
    return {"kernel": job.kernel, "arch": job.arch, "verdict": "fail" if problems else "pass",
            "problems": problems, "variants": per_variant,
            "toolchain": toolchain_fingerprint()}


def summary(result: dict) -> str:
    """A compile verdict as the build's table shows it: registers, spills and SMEM over the
    variants (resources.json has them per variant)."""
    v = list((result.get("variants") or {}).values())
    if not v:
        return result.get("verdict", "?")
    regs = sorted({x["registers"] for x in v})
    spills = sum(x.get("spill_stores", 0) + x.get("spill_loads", 0) for x in v)
    smem = max(x.get("smem_total", 0) for x in v)
    return (f"{result.get('verdict', '?')}: {len(v)} variants, "
            f"{regs[0] if len(regs) == 1 else f'{regs[0]}-{regs[-1]}'} registers, "
            f"{'no spills' if not spills else f'{spills} bytes spilled'}, SMEM up to {smem} bytes")


def run_compile(job: CompileJob, command: list[str], cwd: Path) -> dict:
    """Run nvcc (in cwd, paths relative to it) into a temp file, gate the resources, then
    publish library + resources.json."""
    job.library.parent.mkdir(parents=True, exist_ok=True)
    tmp_lib = job.library.with_name(f".{job.library.name}.{os.getpid()}.tmp")
    cmd = list(command)
    cmd[cmd.index("-o") + 1] = str(tmp_lib)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    except OSError as exc:
        raise CompileError(f"{job.kernel} {job.arch}: cannot run nvcc: {exc}") from exc
    log = f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    write_atomic(job.log, log)
    if proc.returncode != 0:
        tmp_lib.unlink(missing_ok=True)
        errors = [l for l in (proc.stdout + proc.stderr).splitlines() if "error" in l.lower()]
        raise CompileError(f"{job.kernel} {job.arch}: nvcc exited {proc.returncode}:\n"
                           + "\n".join(errors[:20] or log.splitlines()[-20:]) + f"\n(full log: {job.log})")
    result = resource_verdict(job, parse_ptxas(proc.stdout + proc.stderr))
    if result["verdict"] != "pass":
        tmp_lib.unlink(missing_ok=True)
        job.library.unlink(missing_ok=True)
        job.resources.unlink(missing_ok=True)
        raise CompileError(f"{job.kernel} {job.arch}: resource gate failed:\n  "
                           + "\n  ".join(result["problems"]))
    # the library's hash rides in resources.json: GPU gates depend on that small file
    # instead of the ~1 MB library, which SCons would otherwise re-hash on every no-op
    result["library_sha256"] = sha256_file(tmp_lib)
    os.replace(tmp_lib, job.library)
    write_json_atomic(job.resources, result)
    return result


def include_flags(k) -> tuple[str, ...]:
    return tuple(f"-I{d}" for d in k.include_dirs)


def include_inputs(g, k) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(headers, facts) of the body's include folders: every header the body reaches there
    (an input like the body) and the folders themselves (they are nvcc flags)."""
    if not k.include_dirs:
        return (), ()
    from mpkbuild.util.includes import headers
    found = headers([k.body_source], k.include_dirs)
    return (tuple(g.rel(p) for p in found),
            (f"include_dirs: {' '.join(str(d) for d in k.include_dirs)}",))


def nodes(g, k, stage: str) -> None:
    generated = list(k.rel.generated.values())
    compiled = []
    headers, include_facts = include_inputs(g, k)
    for arch in k.archs:
        cmd = nvcc_command(arch, k.rel.generated["harness"], k.rel.gen_dir, k.rel.library(arch),
                           include_flags(k))
        node = g.add(Node(f"compile {k.name} {arch}", "compile", stage, k.name,
                          (k.rel.library(arch), k.rel.resources(arch), k.rel.compile_log(arch)),
                          (*generated, *headers), (toolchain_fact(), g.stage_code(stage), *include_facts),
                          opts=(("MPK_ARCH", arch), ("MPK_NVCC_CMD", cmd)),
                          always=g.edited(k.rel.resources(arch)), verdict_at=1, column=f"compile {arch}",
                          reported=True))
        compiled += node.targets[:2]
    g.requested[(k.name, stage)] = compiled


def run(build, info, target, source) -> int:
    from mpkbuild.stages.generate import smem_plan
    k = build.kernels[info["MPK_KERNEL"]]
    arch = info["MPK_ARCH"]
    plan = smem_plan(k.spec.data["codegen"])
    job = CompileJob(kernel=k.name, arch=arch, variants=k.variants,
                     harness=k.generated["harness"], library=k.library(arch),
                     resources=k.resources(arch), log=k.compile_log(arch),
                     smem_total=plan["total"], smem_budget=plan["budget"])
    try:
        run_compile(job, info["MPK_NVCC_CMD"], k.root)
    except CompileError as exc:
        return build.fail(str(exc))
    return 0


def predict(node, k, predictor) -> None:
    """nvcc's output cannot be known without running it."""
    return None


ACTIONS = {"compile": run}
