"""The package's layers run one way (docs/ARCHITECTURE.md): no import circle anywhere, the
runners import only runners/ and util/, the model and run/ import no stage, no stage
imports the plumbing that judges or draws (status, cli, dagview, sconsign). Every import
counts, lazy ones inside functions too (util/closure's scan, which a full parse checks)."""
import networkx as nx

from mpkbuild.util import closure
from mpkbuild.util.config import PACKAGE_DIR


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        g.add_node(module)
        for name in closure._parse_imports(path.read_text(), path, module):
            while name and closure._file_of(name) is None:      # `from pkg import name`
                name = name.rpartition(".")[0]
            # a submodule importing its own package is how Python runs it, not a layer
            if name and name != module and not module.startswith(name + "."):
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
        if src.startswith(("mpkbuild.model", "mpkbuild.run.", "mpkbuild.util")) and dst.startswith("mpkbuild.stages"):
            bad.append((src, dst, "the model, run/ and util/ import no stage"))
        if src.startswith("mpkbuild.stages.") and dst in ("mpkbuild.status", "mpkbuild.cli", "mpkbuild.dagview",
                                                         "mpkbuild.sconsign"):
            bad.append((src, dst, "no stage imports the plumbing that judges or draws"))
        if src.startswith("mpkbuild.util") and not dst.startswith("mpkbuild.util"):
            bad.append((src, dst, "util/ imports only util/"))
    assert bad == []


def test_a_stage_module_has_no_code_input_from_the_plumbing():
    """A stage's code fact is its closure less the plumbing: an edit of cli.py or status.py
    can change no output."""
    from mpkbuild import stages
    plumbing = {closure._file_of(m) for m in closure.PLUMBING} - {None}
    for s in stages.STAGES:
        files = set(closure.closure_of(s.code_modules()))
        assert not files & plumbing, (s.name, sorted(p.name for p in files & plumbing))
