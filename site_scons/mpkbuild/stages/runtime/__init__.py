"""The runtime gate, build side: the kernel's variants as tasks of the real MPK persistent
kernel of a checkout (`mpk_root=`), generated, compiled and then run on the GPU.

Nodes per kernel (only with mpk_root=, and only for Hopper: the checkout's runtime is
compiled for the GPU's arch):
  megakernel K          build/K/runtime/megakernel.cu   jinja2, computed in memory by predict()
  megakernel-compile K  build/K/runtime/<arch>/libK_mpk.so (+ compile.log)   nvcc with the
                        include paths and macros of Mirage's get_compile_command; its
                        sources are the checkout's runtime headers, so a header edit there
                        makes it stale; one compile covers every variant of the kernel
  runtime K <gpu>       the gate (the table's "runtime" row, run by stages/gates.py; runner runners/runtime.py)

The generated file includes persistent_kernel.cuh and supplies what Mirage's compile()
would write: `_init_persistent_kernel` (one graph per variant: terminate task, begin-graph
task whose launch-dependent event starts every task of the variant, each task triggering
the end-of-graph event, which is the last event) and `_execute_task`, whose branches are
the very call the wire stage registers (wire.section's call lines with the variant's
symbols substituted). Per variant, one more graph per incumbent the spec names
(runtime.incumbent: the MPK task it would replace, wire/incumbents.py), dispatched with the
call the checkout's own register function emits; the gate runs it beside ours (judge.py).
Per block of the spec's runtime.blocks and batch, one graph of the block's layers (other
kernels' variants among them: their specs, headers and bodies are inputs too) and one of
the incumbents' chain. What is MPK's (the checkout, its compile flags, the graphs, the
megakernel source) is megakernel.py; this module is the stage: its nodes and actions.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mpkbuild.model.graph import Node
from mpkbuild.util import config, tma
from mpkbuild.util.console import say
from mpkbuild.util.fsutil import read_json, write_atomic
from mpkbuild.stages.runtime.megakernel import (compile_megakernel, companions_for, has_minimal_worker,
                                                job_payload, render_all, runtime_fact, worker_facts)


# ---------------------------------------------------------------- paths
def runtime_dir(k) -> Path:
    return k.build_dir / "runtime"


def source_path(k) -> Path:
    return runtime_dir(k) / "megakernel.cu"


def _worker_dir(k, arch: str, alone: str | None) -> Path:
    """A block's graph is named block:<name>:b<batch>; its folder takes '-' for ':'."""
    return runtime_dir(k) / arch / ("alone/" + alone.replace(":", "-") if alone else "")


def library_path(k, arch: str = "sm_90a", alone: str | None = None) -> Path:
    """The gate's worker's library, or (alone) that of a variant's or block's worker alone."""
    return _worker_dir(k, arch, alone) / f"lib{k.name}_mpk.so"


def worker_path(k, arch: str = "sm_90a", alone: str | None = None) -> Path:
    """The worker's registers, stack and spills as the megakernel's compile built it."""
    return _worker_dir(k, arch, alone) / "worker.json"


def kernel_with(k, variants: dict, runtime: dict):
    """k (its spec's own values) with other variants and another runtime section: the
    megakernel of another set of graphs (the tune's runtime trial; a composition
    experiment, bench/worker_evidence.py). Its wiring's test variant is the first of them."""
    import copy
    from dataclasses import replace
    from mpkbuild.stages.generate.section import SECTION as CODEGEN
    from mpkbuild.util.fsutil import dump_json, sha256_json
    data = copy.deepcopy(k.base.data)
    data["codegen"]["variants"] = copy.deepcopy(variants)
    data["runtime"] = copy.deepcopy(runtime)
    if "wiring" in data:
        data["wiring"]["test_variant"] = next(iter(variants))
    data = json.loads(dump_json(data))
    sections = dict(k.base.sections)
    sections["codegen"] = {key: data[key] for key in CODEGEN.keys}
    sections["runtime"] = {**sections.get("runtime", {}), "runtime": data["runtime"]}
    if "wiring" in data:
        sections["wiring"] = {**sections["wiring"], "wiring": data["wiring"]}
    signatures = {**k.base.signatures, **{s: sha256_json(sections[s]) for s in ("codegen", "runtime")}}
    return replace(k, spec=replace(k.base, data=data, sections=sections, signatures=signatures),
                   base_spec=None, tuned=None)


def build_in(k, work: Path, checkout, runtime: str = "v1") -> tuple[bool, str, float, Path]:
    """k's megakernel (k's own variants and graphs: kernel_with) rendered and compiled in
    `work`, its generated headers under work/gen: (ok, nvcc's log text, seconds, library).
    The tune's runtime trial and a composition experiment build theirs so."""
    from mpkbuild.stages import generate
    work = Path(work).resolve()        # nvcc's split steps run in another folder
    section = k.spec.sections["codegen"]
    for role, name in (("spec_header", f"{k.name}_spec.h"), ("body", f"{k.name}.cuh")):
        generate.generate_file(role, section, k.spec.file, k.body_source, k.root, work / "gen" / name)
    for name, data in render_all(k, config.wiring_roots(k.root), checkout.root, (), runtime).items():
        write_atomic(work / name, data, only_if_changed=True)
    lib = work / f"lib{k.name}_mpk.so"
    ok, text, took = compile_megakernel(checkout, work / "megakernel.cu", [work / "gen", *k.include_dirs],
                                        lib, work / "compile.log", shadow=work / "shadow", runtime=runtime)
    return ok, text, took, lib


def alone_workers(k, runtime: str) -> list[str]:
    """The variants (and blocks' graphs) whose worker alone is built beside the gate's: where
    that is production-shaped, each is also timed in a worker of only itself and its
    incumbents, so that what the model's tasks and the other variants do to it is seen
    (issue 59); none otherwise."""
    from mpkbuild.stages.runtime.megakernel import alone_units
    return alone_units(k.spec.data) if has_minimal_worker(k.spec.data, runtime) else []


def shadow_dir(k) -> Path:
    """The include folder searched first: the checkout's entry header beside a task header
    of only the tasks the graphs use (megakernel.render_all)."""
    return runtime_dir(k) / "shadow"


def source_files(k, runtime: str = "v1", companions=()) -> dict[str, Path]:
    """render_all's names -> the megakernel node's targets (a kernel the graphs run that
    loads with TMA brings the shadow's tma.cuh)."""
    from mpkbuild.stages.runtime.megakernel import DISPATCH_V2, ENTRY_HEADER, TASK_HEADER, TMA_HEADER
    files = {"megakernel.cu": source_path(k), f"shadow/{TASK_HEADER}": shadow_dir(k) / TASK_HEADER,
             f"shadow/{ENTRY_HEADER}": shadow_dir(k) / ENTRY_HEADER}
    if runtime == "v2":
        files[f"shadow/{DISPATCH_V2}"] = shadow_dir(k) / DISPATCH_V2
    if loads_with_tma(k, companions):
        files[f"shadow/{TMA_HEADER}"] = shadow_dir(k) / TMA_HEADER
    return files


def loads_with_tma(k, companions=()) -> bool:
    return any(tma.tensors(x.spec.data["codegen"]) for x in (k, *companions))


# ---------------------------------------------------------------- the stage's nodes
def nodes(g, k, stage: str) -> None:
    """The megakernel source, its compile and the gate (with mpk_root= and a Hopper arch)."""
    from mpkbuild.stages import gates
    from mpkbuild.stages import table as stages
    request = g.runtime_request
    checkout = request.checkout if request is not None else None
    if checkout is None or "sm_90a" not in k.archs or not k.has_wiring:
        g.requested[(k.name, stage)] = []
        if request is not None and request.why_none:
            g.note(stage, f"no runtime gate for any kernel: {request.why_none}")     # printed once per run
        return
    gen = [k.rel.generated["spec_header"], k.rel.generated["body"]]
    # the kernels k's blocks run beside it: what the source reads of them (their variants
    # and registered calls), what the compile includes, what the gate runs (their inputs
    # and references)
    companions = companions_for(k, g.kernels)
    extra = [r for c in companions for r in (c.rel.section_file("codegen"), c.rel.section_file("wiring"),
                                             c.rel.generated["spec_header"], c.rel.generated["body"])]
    gate_extra = [r for c in companions for r in (c.rel.section_file("generators"),
                                                  c.rel.section_file("validate"),
                                                  *gates.python_rels(c, stages.BY_NAME[stage].gate))]
    runtime = request.runtime
    fact = runtime_fact(checkout.root, runtime)
    targets = tuple(g.rel(p) for p in source_files(k, runtime, companions).values())
    src = g.add(Node(f"megakernel {k.name}", "megakernel", stage, k.name, targets,
                     (k.rel.section_file("codegen"), k.rel.section_file("wiring"),
                      k.rel.section_file("runtime"), *gen, *extra,
                      *megakernel_inputs(g, checkout, runtime, loads_with_tma(k, companions))),
                     (fact, g.code_fact("megakernel", (f"{__name__}.megakernel",))),
                     always=next(filter(None, map(g.edited, targets)), None), column="megakernel"))
    from mpkbuild.stages.compile import include_inputs
    from mpkbuild.util.toolchain import toolchain_fact
    lib = library_path(k)
    headers, include_facts = include_inputs(g, k)
    runtime_headers = tuple(g.rel(p) for p in checkout.headers())
    built = [lib, lib.parent / "compile.log", worker_path(k)]
    for unit in alone_workers(k, runtime):
        small = library_path(k, alone=unit)
        built += [small, small.parent / "compile.log", worker_path(k, alone=unit)]
    comp = g.add(Node(f"megakernel-compile {k.name} sm_90a", "megakernel_compile", stage, k.name,
                      tuple(g.rel(p) for p in built),
                      tuple(dict.fromkeys((*src.targets, *gen, *[p for p in extra if p.endswith((".h", ".cuh"))],
                                           *runtime_headers, *headers))),
                      (toolchain_fact(), fact, g.code_fact("megakernel", (f"{__name__}.megakernel",)),
                       *include_facts), column="megakernel-compile"))
    gates.gate_nodes(g, k, stage, library=comp.targets[0], extra_facts=(fact,),
                     extra_sources=(*gate_extra, *comp.targets[2:]))


# the tool's templates a v1 megakernel is rendered from (v2 adds megakernel_v2.cu.j2)
MEGAKERNEL_TEMPLATES = ("megakernel.cu.j2", "task_header.cuh.j2", "megakernel_parts.cu.j2")


def megakernel_inputs(g, checkout, runtime: str, with_tma: bool) -> tuple[str, ...]:
    """What a megakernel's source is rendered from besides the kernels' own files: the
    checkout's register functions (the incumbents' and the production worker's calls),
    its entry header, its enum (the gate's task types are numbers it leaves free), the
    templates, v2's driver and task headers, the tma.cuh a TMA kernel's cases go into, the
    wiring surfaces."""
    from mpkbuild.stages.runtime.megakernel import ENTRY_HEADER
    from mpkbuild.wire.incumbents import REGISTER_FILE
    register = [g.rel(checkout.root / REGISTER_FILE)] if (checkout.root / REGISTER_FILE).is_file() else []
    # with TMA the shadow's tma.cuh is the checkout's with the cases of the surface's tma sites
    tma_inputs = ()
    if with_tma:
        from mpkbuild.wire.surface import load_surface
        roots = config.wiring_roots(g.root)
        cases = [site.template for site in load_surface(roots).sites if site.when == "tma"]
        tma_inputs = (g.rel(checkout.runtime_dir / "tma.cuh"),
                      *(g.rel(r / "templates" / t) for r in roots for t in cases
                        if (r / "templates" / t).is_file()))
    v2_inputs = ()
    if runtime == "v2":
        # the v2 driver, its dispatch (the shadow's is made from it) and the v2 task headers
        # (an incumbent's call, the barrier ids checked against them)
        from mpkbuild.wire.barriers import v2_task_headers
        v2_inputs = (g.rel(checkout.runtime_dir / "dispatch_v2.cuh"),
                     g.pkg("templates", "megakernel_v2.cu.j2"),
                     *(g.rel(checkout.runtime_dir / h) for h in v2_task_headers(checkout.root)))
    return (*register, g.rel(checkout.runtime_dir / ENTRY_HEADER), g.rel(checkout.runtime_dir / "runtime_header.h"),
            *(g.pkg("templates", t) for t in MEGAKERNEL_TEMPLATES), *v2_inputs, *tma_inputs,
            *(g.rel(r / config.WIRING_SURFACE) for r in config.wiring_roots(g.root)
              if (r / config.WIRING_SURFACE).is_file()))


def run_source(build, info, target, source) -> int:
    from mpkbuild.stages.generate import TemplateError
    k = build.kernels[info["MPK_KERNEL"]]
    try:
        files = render_all(k, config.wiring_roots(k.root), build.runtime_request.root,
                           companions_for(k, build.kernels), build.runtime_request.runtime)
    except TemplateError as exc:
        return build.fail(str(exc))
    for name, path in source_files(k, build.runtime_request.runtime,
                                   companions_for(k, build.kernels)).items():
        write_atomic(path, files[name], only_if_changed=True)
    return 0


def run_compile(build, info, target, source) -> int:
    """The megakernel's library (and, per alone_workers, each variant's or block's worker
    alone: one source, the nvcc runs side by side, as many at once as there are cores), each
    with its worker's figures."""
    k = build.kernels[info["MPK_KERNEL"]]
    checkout = build.runtime_request.checkout
    gen_dirs = [k.gen_dir, *k.include_dirs]
    for c in companions_for(k, build.kernels):
        gen_dirs += [c.gen_dir, *c.include_dirs]
    paths = [Path(t.abspath) for t in target]
    # the production worker, then each worker alone, its ALONE_MACRO index its place in the list
    alone = [None, *alone_workers(k, build.runtime_request.runtime)]
    builds = [(paths[3 * i:3 * i + 3], unit) for i, unit in enumerate(alone)]

    def one(i):
        lib, log, _ = builds[i][0]
        return compile_megakernel(checkout, source_path(k), gen_dirs, lib, log, shadow=shadow_dir(k),
                                  runtime=build.runtime_request.runtime, alone=i - 1 if i else None)

    with ThreadPoolExecutor(max_workers=min(len(builds), os.cpu_count() or 1)) as pool:
        done = list(pool.map(one, range(len(builds))))
    for (build_paths, unit), (ok, text, took) in zip(builds, done):
        what = f"the worker of {unit} alone of " if unit else ""
        if not ok:
            return build.fail(f"megakernel-compile {k.name}: nvcc of {what}it failed ({took:.0f} s), see "
                              f"{os.path.relpath(build_paths[1], build.root)}\n"
                              + "\n".join(l for l in text.splitlines() if "error" in l)[:4000])
        write_atomic(build_paths[2], json.dumps(worker_facts(text), indent=1, sort_keys=True) + "\n")
    took = [t for _, _, t in done]
    say(f"          megakernel {k.name}: compiled in {took[0]:.1f} s"
        + (f" (the production worker), and {len(took) - 1} workers of one variant or block alone in "
           f"{min(took[1:]):.1f}-{max(took[1:]):.1f} s" if len(took) > 1 else ""))
    return 0


def predict(node, k, predictor) -> dict:
    from mpkbuild.model.graph import CHANGED
    if node.kind == "megakernel":
        runtime = predictor.runtime_request.runtime
        companions = companions_for(k, predictor.kernels)
        files = render_all(k, predictor.wiring_root, predictor.runtime_request.root, companions, runtime)
        return {t: files[name] for t, name in zip(node.targets, source_files(k, runtime, companions))}
    if node.kind in ("gate", "check"):
        from mpkbuild.stages import gates
        return gates.predict(node, k, predictor)
    return {t: CHANGED for t in node.targets}


ACTIONS = {"megakernel": run_source, "megakernel_compile": run_compile}


def gate_job(k, build, arch: str, payload: dict) -> tuple[Path, list[Path]]:
    """The gate loads the megakernel, not the harness library, and the runner needs the
    graphs (stages/gates.run_gate asks the stage): returns the library it loads and the
    Python files of the kernels k's blocks run (their references), which the job carries."""
    from mpkbuild.stages import gates
    from mpkbuild.stages import table as stages
    library = library_path(k, arch)
    payload.update(library=str(library), runtime=job_payload(k, build))
    payload["runtime"]["worker"] = read_json(worker_path(k, arch)) or {}
    more = []
    alone = alone_workers(k, build.runtime_request.runtime)
    if alone:
        more = [library_path(k, arch, alone=v) for v in alone]
        payload["library_alone"] = {v: str(p) for v, p in zip(alone, more)}
        payload["runtime"]["worker_alone"] = {v: read_json(worker_path(k, arch, alone=v)) or {} for v in alone}
    # the worker the last verdict was measured in: a new variant (or any other task body
    # compiled in) moves every variant's figures, and the result says so
    last = read_json(k.root / k.rel.gate_result("runtime", build.fingerprint.key)) or {}
    payload["runtime"]["worker_before"] = last.get("worker") or {}
    kind = stages.BY_NAME["runtime"].gate
    return library, more + [p for c in companions_for(k, build.kernels) for p in gates.python_files(c, kind)]
