"""The generate stage: render the spec header, the task body and the harness with jinja2.

Every generated file comes from a template rendered under StrictUndefined; a template
error is re-raised as :class:`TemplateError` naming the template file and line. Each file
is written only when its bytes change, so an unchanged render never triggers nvcc.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

from mpkbuild.util import config, expr, tma
from mpkbuild.util.templates import same_bytes_loader
from mpkbuild.util.config import CTYPES
from mpkbuild.model.graph import Node
from mpkbuild.util.fsutil import write_atomic
from mpkbuild.wire.barriers import V2_TASK_BARRIER
from mpkbuild.util.expr import grid_size, tensor_shape, variant_symbols
from mpkbuild.stages.generate import pipeline
from mpkbuild.stages.generate.plan import smem_layout, variant_tensors


class TemplateError(Exception):
    """A template that does not render: names template file and line."""


@functools.lru_cache(maxsize=64)
def _environment(search_path: tuple[str, ...]):
    """One environment per search path, so each template is compiled once a process:
    planning renders the megakernels and the generated files of every kernel to predict
    them, ~40 renders of ~20 templates (util/templates.py: reused while its bytes hold)."""
    import jinja2   # imported on first render: a no-op build or a status never renders
    return jinja2.Environment(
        loader=same_bytes_loader(search_path),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)


def render_template(path: Path, context: dict, display: str | None = None) -> str:
    """Render one template file; errors name `display` (or path) and the template line."""
    display = display or str(path)
    import jinja2
    env = _environment((str(path.parent), str(config.TEMPLATE_DIR)))
    try:
        return env.get_template(path.name).render(**context)
    except UnicodeDecodeError as exc:
        raise TemplateError(_not_utf8(display, exc)) from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{display}:{exc.lineno}: template syntax error: {exc.message}") from exc
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{display}:{_template_line(exc, path)}: {exc}") from exc


def _not_utf8(display: str, exc: UnicodeDecodeError) -> str:
    """'file:line: not UTF-8 text' for the file whose bytes did not decode (the whole file
    is decoded at once, so the offset is the file's)."""
    line = exc.object.count(b"\n", 0, exc.start) + 1
    return f"{display}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x})"


def _template_line(exc: BaseException, path: Path) -> int | str:
    tb = exc.__traceback__
    line = "?"
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _cpp_name(name: str) -> str:
    return name.upper()


def _cpp_literal(value) -> tuple[str, str]:
    if isinstance(value, bool):
        return "bool", "true" if value else "false"
    if isinstance(value, int):
        return "int", str(value)
    return "float", f"{value!r}f"


def smem_plan(codegen: dict, variant: str | None = None) -> dict:
    """Region offsets laid out in order with their alignment; total and budget.

    Region sizes may use variant symbols. With a variant: that variant's plan. Without one:
    the plan of the variant that needs the most (what a resource gate must allow for), and
    `uniform` says whether every variant has the same plan."""
    if variant is not None or not codegen.get("variants"):
        symbols = variant_symbols(codegen, variant) if variant is not None else expr.constants(codegen)
        regions, total = smem_layout(codegen["smem"], symbols)
        return {"regions": [{**r, "NAME": _cpp_name(r["name"])} for r in regions],
                "total": total, "budget": codegen["smem"]["budget"], "uniform": True,
                "base_align": max([16] + [r["align"] for r in regions])}
    plans = [smem_plan(codegen, v) for v in codegen["variants"]]
    biggest = max(plans, key=lambda p: p["total"])
    return {**biggest, "uniform": all(p == plans[0] for p in plans),
            "base_align": max([16] + [r["align"] for p in plans for r in p["regions"]])}


def _variant_views(codegen: dict) -> list[dict]:
    views = []
    for name in codegen["variants"]:
        symbols = variant_symbols(codegen, name)
        grid = grid_size(codegen, symbols)
        tensors = []
        declared = variant_tensors(codegen, name)
        for kind in ("inputs", "outputs"):
            for t in declared[kind]:
                shape = tensor_shape(t, symbols)
                per_task = 0
                if 0 in t["partition"]:
                    d = t["partition"].index(0)
                    per_task = shape[d] // grid
                    for extent in shape[d + 1:]:
                        per_task *= extent
                tensors.append({"name": t["name"], "kind": kind, "ctype": CTYPES[t["dtype"]],
                                "const": kind == "inputs", "shape": shape,
                                "task_stride": per_task})
        views.append({
            "name": name, "grid": grid, "binding": codegen["variants"][name],
            "tma": _variant_maps(codegen, symbols, tensors),
            "min_blocks": int(expr.evaluate(codegen["min_blocks_per_sm"], symbols)),
            "smem": smem_plan(codegen, name),
            "template_args": [codegen["variants"][name][p] for p in codegen["template_params"]],
            "tensors": tensors,
            "pipeline": "pipeline" in codegen,
            "tiling": [{"symbol": r["symbol"], "SYMBOL": _cpp_name(r["symbol"]),
                        "value": codegen["variants"][name][r["symbol"]],
                        "rule": r["multiple_of"],
                        "cpp": expr.to_cpp(r["multiple_of"], _cpp_name), "index": i}
                       for i, r in enumerate(codegen["tiling"])],
        })
    return views


def _variant_maps(codegen: dict, symbols: dict, tensors: list[dict]) -> list[dict]:
    """Each TMA-loaded input's per-task map as the runtime makes it: the task's tile (rows,
    cols), the whole tensor's row stride, where a task's tile starts (elements)."""
    out = []
    for name in tma.tensors(codegen):
        i = next(j for j, t in enumerate(tensors) if t["name"] == name)
        rows, cols = (int(expr.evaluate(d, symbols)) for d in pipeline.tile_texts(codegen, name))
        out.append({"tensor": name, "input": i, "rows": rows, "cols": cols,
                    "row_stride": tensors[i]["shape"][1], "task_stride": tensors[i]["task_stride"]})
    return out


def context(section: dict, spec_file: str) -> dict:
    """The template context: everything a header, body or harness template may read."""
    cg = section["codegen"]
    params = [{"name": k, "NAME": _cpp_name(k), "ctype": _cpp_literal(v)[0],
               "literal": _cpp_literal(v)[1], "value": v} for k, v in cg["params"].items()]
    return {
        "kernel": section["kernel"], "op": section["op"], "family": section["family"],
        "body_namespace": config.body_namespace(section["kernel"]),
        "spec": config.spec_namespace(section["kernel"]),
        "spec_file": spec_file, "threads": cg["threads"], "params": cg["params"],
        # default-off switches: plain jinja booleans, never rendered into a header, so a
        # lever that is off changes no generated byte (tests/stages/test_tune.py proves it)
        "levers": {name: bool(lever["default"]) for name, lever in cg.get("levers", {}).items()},
        "worker_threads": config.MPK_WORKER_THREADS,
        "worker_block_max": max(config.WORKER_MODE_BLOCKS),
        "v2_task_barrier": V2_TASK_BARRIER,
        "param_list": params, "template_params": cg["template_params"],
        "smem": smem_plan(cg), "variants": _variant_views(cg), "pipeline": pipeline.view(cg),
        "inputs": [{"name": t["name"], "ctype": CTYPES[t["dtype"]], "runtime": t.get("runtime")}
                   for t in cg["inputs"]],
        # the ints the body takes after its tensors: the task's index, under MPK's names
        "task_metadata": config.task_metadata(cg),
        "outputs": [{"name": t["name"], "ctype": CTYPES[t["dtype"]]} for t in cg["outputs"]],
    }


def render_file(role: str, section: dict, spec_file: str, body_source: Path | None,
                root: Path) -> str:
    """Render one generated file by role: spec_header, body or harness."""
    ctx = context(section, spec_file)
    if role == "spec_header":
        return render_template(config.TEMPLATE_DIR / "spec_header.h.j2", ctx)
    if role == "harness":
        return render_template(config.TEMPLATE_DIR / "harness.cu.j2", ctx)
    if role == "body":
        assert body_source is not None
        display = str(body_source.relative_to(root)) if body_source.is_relative_to(root) else str(body_source)
        if body_source.name.endswith(".j2"):
            text = render_template(body_source, ctx, display)
        else:
            try:
                text = body_source.read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TemplateError(_not_utf8(display, exc)) from None
        return in_namespace(text, ctx["body_namespace"], display)
    raise ValueError(f"unknown generated file role {role!r}")


def _preprocessor_edges(lines: list[str]) -> tuple[int, int]:
    """Where the namespace opens and closes: after the leading run of blank, comment and #
    lines (cut after its last # line: a comment there documents the code below it), and
    before the #endifs at the end that close conditionals that run opened (an include guard)."""
    cut, depth, block, cont = 0, 0, False, False
    for i, line in enumerate(lines):
        s = line.strip()
        if block:
            block = "*/" not in s
        elif cont or s.startswith("#"):
            word = re.match(r"#\s*(\w*)", s)
            if not cont and word:
                depth += {"if": 1, "ifdef": 1, "ifndef": 1, "endif": -1}.get(word.group(1), 0)
            cont, cut = s.endswith("\\"), i + 1
        elif s.startswith("/*"):
            block = "*/" not in s[2:]
        elif s and not s.startswith("//"):
            break
    tail = len(lines)
    while depth and tail > cut:
        s = lines[tail - 1].strip()
        if re.match(r"#\s*endif\b", s):
            depth -= 1
        elif s and not s.startswith("//"):
            break
        tail -= 1
    return cut, tail


def in_namespace(text: str, namespace: str, display: str) -> str:
    """The body with its code in `namespace`, its includes and pragmas outside: the author
    writes a body as at global scope, and it installs beside upstream's tasks without a name
    of it at global scope. A trailing #endif (an include guard) closes after the namespace."""
    lines = text.splitlines(keepends=True)
    cut, tail = _preprocessor_edges(lines)
    late = [cut + i + 1 for i, line in enumerate(lines[cut:tail])
            if re.match(r"\s*#\s*include\b", line)]
    if late:
        raise TemplateError(f"{display}: line {late[0]} of the rendered body: #include after the "
                            f"body's first code: the tool puts the body's code in namespace "
                            f"{namespace}, and an include there would be too; move every "
                            "#include to the top of the body")
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # the blank line after the includes, where there is one, takes the opening: the code
    # keeps its line numbers, and nvcc's and the lint's lines are the author's
    skip = 1 if cut < tail and not lines[cut].strip() else 0
    return "".join(lines[:cut] + [f"namespace {namespace} {{\n"] + lines[cut + skip:tail]
                   + [f"}}  // namespace {namespace}\n"] + lines[tail:])


# The body contract the rendered body is held to before it reaches a GPU (docs/spec.md,
# codegen.body): (what it catches, pattern, what to do instead). A line that says
# `mpk-lint: allow` is left alone (the fault fixtures break the contract on purpose).
BODY_RULES = (
    ("identity from the block", r"\b(blockIdx|gridDim)\b",
     "in MPK one worker block runs many tasks: a task is `task_index` and its pointers"),
    ("a barrier over the whole block", r"__syncthreads(_count|_and|_or)?\s*\(|\bbar(rier)?\.sync(\.aligned)?\s+0\b",
     "the body runs on the first THREADS threads of a larger worker block: use "
     "{kernel}_spec::task_barrier() (a named barrier over those threads)"),
    ("the block's size", r"\bblockDim\b",
     "the block may be larger than the body's threads: use {kernel}_spec::THREADS"),
    ("a literal thread count", r"\b(constexpr|const|static|#define)\b[^=;\n]*\b(THREADS|NUM_THREADS|BLOCK_SIZE)\b\s*=?\s*\d+\s*[;\n]",
     "the count is the spec's codegen.threads: use {kernel}_spec::THREADS"),
    # Runtime-V2 runs a task on its compute warps beside the runtime's own, with the other
    # tasks of the graph on named barriers of their own: the id must be the tool's
    ("a named barrier of its own", r"\b(bar|barrier)\.(sync|arrive|red)\b(?!(\.aligned)?\s+0\b)|\bNamedBarrier\b",
     "its id could be one another task of the graph uses (wire/barriers.py): use "
     "{kernel}_spec::task_barrier(), whose id the tool assigns per runtime"),
    # an mbarrier protocol is the spec's (codegen.pipeline), audited at load, and the header's
    # helpers re-initialise, fence and count it as audited
    ("hand-rolled pipeline PTX", r"\b(mbarrier\.\w|cp\.async\.bulk\b|elect\.sync\b|fence\.mbarrier_init\b|tcgen05\.commit\b)",
     "a protocol written by hand is checked by nothing: declare it in codegen.pipeline and "
     "use {kernel}_spec::pipeline's helpers (ring<...>::begin, arrive, arrive_expect_tx, wait, copy)"),
    ("state kept in a __device__ global", r"(?m)^[ \t]*(static[ \t]+)?__device__[ \t]+(?!.*\()(?!(const|constexpr)\b)[^;\n]*;",
     "MPK runs the graph again every iteration in one persistent kernel (Runtime-V2: every "
     "iteration in one launch), so what a global keeps from a task is there at the next: "
     "keep a task's state in its SMEM or outputs (an intended global: mark it mpk-lint: allow)"),
)
_COMMENTS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)
_BEGIN = re.compile(r"::\s*begin\s*\(\s*\w")     # R::begin(bars), R a pipeline::ring<...>


def lint_body(text: str, kernel: str, display: str) -> list[str]:
    """'file:line: ...' for every line of a rendered body that breaks the body contract
    (comments are not code)."""
    # comments blanked (their lines kept); string literals kept: an asm string is code
    code = _COMMENTS.sub(lambda m: m.group(0) if m.group(0).startswith('"') else
                         re.sub(r"[^\n]", " ", m.group(0)), text)
    raw = text.splitlines()
    out = []
    for what, pattern, instead in BODY_RULES:
        for m in re.finditer(pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            if "mpk-lint: allow" in raw[line - 1]:
                continue
            out.append(f"{display}:{line}: {what} ({raw[line - 1].strip()}): "
                       + instead.format(kernel=kernel))
    return sorted(out, key=lambda s: int(s.split(":")[1]))


class ContractError(TemplateError):
    """A rendered body that breaks the body contract: named by file and line."""


def generate_file(role: str, section: dict, spec_file: str, body_source: Path | None,
                  root: Path, target: Path) -> bool:
    """Render and write one file atomically; True when its bytes changed. A body that
    breaks the contract is refused, and the previous file is left as it was."""
    text = render_file(role, section, spec_file, body_source, root)
    if role == "body":
        problems = lint_body(text, section["kernel"], os.path.relpath(target, root))
        if "pipeline" in section["codegen"] and not _BEGIN.search(_COMMENTS.sub(" ", text)):
            problems.append(f"{os.path.relpath(target, root)}: the body declares codegen.pipeline and never "
                            "calls its ring's begin(bars) ({kernel}_spec::pipeline::ring<...>::begin): the mbarriers "
                            "would keep the last task's phases (call it first, on every body thread)"
                            .format(kernel=section["kernel"]))
        if problems:
            raise ContractError(f"{len(problems)} line(s) of the task body break its contract "
                                "(one worker block runs many tasks, on more threads than the body's):\n  "
                                + "\n  ".join(problems))
    return write_atomic(target, text, only_if_changed=True)


def tool_templates(codegen: dict, role: str) -> tuple[str, ...]:
    """The tool's templates (under config.TEMPLATE_DIR) a generated file of this role is
    rendered from: inputs of its node, of every node that renders its own copy (a tune
    candidate, wire), and signed by a tune's key, so that a tool upgrade that changes the
    code they render re-runs what read it."""
    if role == "spec_header":
        return ("spec_header.h.j2", *(pipeline.TEMPLATES if "pipeline" in codegen else ()))
    return ("harness.cu.j2",) if role == "harness" else ()


def template_inputs(g, k, *roles: str) -> tuple[str, ...]:
    """tool_templates of k's roles, as node inputs."""
    return tuple(g.pkg("templates", t) for role in roles for t in tool_templates(k.spec.data["codegen"], role))


def nodes(g, k, stage: str) -> None:
    codegen_section = k.rel.section_file("codegen")
    sources = {
        "spec_header": (codegen_section, *template_inputs(g, k, "spec_header")),
        # the body's node reads the codegen section even where the body is no template (its
        # kernel name and pipeline for the contract check): without the edge, -j ran it first
        "body": (codegen_section, k.rel.body_source),
        "harness": (codegen_section, *template_inputs(g, k, "harness")),
    }
    generated = []
    for role, path in k.rel.generated.items():
        generated.append(path)
        g.add(Node(f"generate {k.name} {path.rsplit('/', 1)[1]}", "generate", stage, k.name, (path,),
                   sources[role], (g.stage_code(stage),), opts=(("MPK_ROLE", role),),
                   always=g.edited(path), precious=True, column="generate"))
    g.requested[(k.name, stage)] = generated


def run_generate(build, info, target, source) -> int:
    k = build.kernels[info["MPK_KERNEL"]]
    section = json.loads(k.section_file("codegen").read_text())
    try:
        generate_file(info["MPK_ROLE"], section, k.spec.file, k.body_source, k.root,
                      Path(target[0].abspath))
    except TemplateError as exc:
        return build.fail(str(exc))
    return 0


def predict(node, k, predictor) -> dict:
    role = dict(node.opts)["MPK_ROLE"]
    text = render_file(role, k.spec.sections["codegen"], k.spec.file, k.body_source, k.root)
    if role == "body" and (problems := lint_body(text, k.name, node.targets[0])):
        raise ContractError("; ".join(problems))
    return {node.targets[0]: text.encode()}


ACTIONS = {"generate": run_generate}


if __name__ == "__main__":  # pragma: no cover - debugging aid: render one role to stdout
    sec = json.loads(Path(sys.argv[1]).read_text())
    print(render_file(sys.argv[2], sec, sys.argv[1], Path(sys.argv[3]) if len(sys.argv) > 3 else None,
                      Path.cwd()))
