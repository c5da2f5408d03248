"""The package's layers run one way (docs/ARCHITECTURE.md): no import circle anywhere, not
even inside a package (a submodule importing its own package's __init__ is one), the
runners import only runners/ and util/ and evaluate no spec expression, the model imports no stage and no engine, no
stage imports the plumbing that judges or draws (status, cli, dagview, sconsign), and the
stages import one another only along the arrows drawn in docs/ARCHITECTURE.md. Every
import counts, lazy ones inside functions too (a full parse of each file)."""
import ast

import networkx as nx

from mpkbuild.util import closure
from mpkbuild.util.config import PACKAGE_DIR

# stage -> the stages it imports (a stage: a module or package under stages/, the table
# and the shared gate machinery counted as their own); docs/ARCHITECTURE.md draws the same
STAGE_ARROWS = {
    "compile": {"generate"},
    "gates": {"table"},
    "generate": set(),
    "perf": {"gates"},
    "profile": {"gates"},
    "review": {"gates", "generate", "spec", "table"},
    "runtime": {"compile", "gates", "generate", "perf", "table", "wire"},
    "spec": set(),
    "table": set(),
    "tune": {"compile", "gates", "generate", "runtime", "table"},
    "validate": {"gates"},
    "wire": {"generate", "table"},
}

def _module_name(path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The package's modules this file imports: `from pkg import sub` is sub (a module)
    or pkg (a name in its __init__)."""
    package = module if is_package else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if closure._file_of(sub) is not None else base)
    found = set()
    for name in out:
        while name and closure._file_of(name) is None:
            name = name.rpartition(".")[0]
        if name.split(".")[0] == closure.PACKAGE and name != module:
            found.add(name)
    return found


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in PACKAGE_DIR.rglob("*.py"):
        module = _module_name(path)
        g.add_node(module)
        for name in _imported(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            g.add_edge(module, name)
    return g


def test_no_import_circle():
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], [" -> ".join(c) for c in cycles[:5]]


def test_the_layers_run_one_way():
    g = import_graph()
    bad = []
    for src, dst in g.edges:
        if src.startswith("mpkbuild.runners") and not dst.startswith(("mpkbuild.runners", "mpkbuild.util")):
            bad.append((src, dst, "runners import only runners/ and util/"))
        if src.startswith("mpkbuild.runners") and dst == "mpkbuild.util.expr":
            bad.append((src, dst, "runners evaluate no spec expression: the build resolves them (runners/facts.py)"))
        if src.startswith("mpkbuild.model") and not dst.startswith(("mpkbuild.model", "mpkbuild.util")):
            bad.append((src, dst, "the model imports only the model and util/ (no stage, no engine)"))
        if src.startswith(("mpkbuild.run.", "mpkbuild.wire", "mpkbuild.gpu")) and dst.startswith("mpkbuild.stages"):
            bad.append((src, dst, "the engines import no stage"))
        if src.startswith("mpkbuild.stages.") and dst in ("mpkbuild.status", "mpkbuild.cli", "mpkbuild.dagview",
                                                         "mpkbuild.sconsign", "mpkbuild.stages"):
            bad.append((src, dst, "no stage imports the plumbing (the table is stages/table.py)"))
        if src.startswith("mpkbuild.util") and not dst.startswith("mpkbuild.util"):
            bad.append((src, dst, "util/ imports only util/"))
    assert bad == []


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "stages" else None


def test_the_stages_import_one_another_only_along_the_drawn_arrows():
    g = import_graph()
    arrows = {s: set() for s in STAGE_ARROWS}
    for src, dst in g.edges:
        a, b = _stage_of(src), _stage_of(dst)
        if a and b and a != b:
            arrows.setdefault(a, set()).add(b)
    assert arrows == STAGE_ARROWS


def test_a_stage_module_has_no_code_input_from_the_plumbing():
    """A stage's code fact is its closure less the plumbing: an edit of cli.py or status.py
    can change no output."""
    from mpkbuild import stages
    plumbing = {closure._file_of(m) for m in closure.PLUMBING} - {None}
    for s in stages.STAGES:
        files = set(closure.closure_of(s.code_modules()))
        assert not files & plumbing, (s.name, sorted(p.name for p in files & plumbing))
