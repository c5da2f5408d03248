"""v1 -> v2 ports (wiring.port): a kernel takes over an existing layer on Runtime-V2 through a
use_v2_runtime branch in that layer, not a second layer; refused, writing nothing, where the
layer cannot hand the body what the spec describes."""
from __future__ import annotations

import ast
import copy

import pytest

from mpkbuild.util import tma
from mpkbuild import wire
from mpkbuild.wire.errors import AnchorNotFound, NameClash

from test_wire_real import MIRAGE, WIRING, catalog, copy_tree, snapshot

pytestmark = pytest.mark.skipif(not (MIRAGE / "v2").is_dir(), reason=f"{MIRAGE}/v2 is absent "
                                "(the pinned Runtime-V2 tree is only where ../shared is)")
PY = "python/mirage/mpk/persistent_kernel.py"


def _specs(**ports):
    specs, sources = catalog()
    specs = copy.deepcopy(specs)
    for s in specs:
        if s["kernel"] in ports:
            s["wiring"]["port"] = ports[s["kernel"]]
    # planned on v2: every catalog kernel but one that loads with TMA (refused there)
    return specs, sources, sorted(s["kernel"] for s in specs if not tma.tensors(s["codegen"]))


def _method(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_a_port_branches_the_existing_layer_applies_twice_and_unwires_exactly(tmp_path):
    root = copy_tree("v2", tmp_path)
    pristine = snapshot(root)
    specs, sources, names = _specs(rmsnorm_v2="rmsnorm")
    p = wire.plan(root, specs, WIRING, names, sources=sources, runtime="v2")
    assert p.problems == []
    wire.apply(p)
    text = (root / PY).read_text()
    compile(text, PY, "exec")                               # Python, a return inside a def
    tree = ast.parse(text)
    layers = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert "rmsnorm_v2_layer" not in layers                 # no second layer ...
    assert "silu_mul_v2_layer" in layers                    # ... the others get theirs
    fn = _method(tree, "rmsnorm_layer")
    # right after the graph is built, before upstream's own v2 branch: ours registers and returns
    i = next(j for j, st in enumerate(fn.body) if "customized" in ast.unparse(st))
    ours, theirs = fn.body[i + 1], fn.body[i + 2]
    assert ast.unparse(ours.test) == "getattr(self, 'use_v2_runtime', False)"
    assert "'rmsnorm_v2_v2'" in ast.unparse(ours.body[0]) and isinstance(ours.body[-1], ast.Return)
    assert "rmsnorm_hopper_v2" in ast.unparse(theirs)      # upstream's branch, untouched
    again = wire.plan(root, specs, WIRING, names, sources=sources, runtime="v2")
    assert again.empty and again.problems == []
    wire.apply(wire.plan_unwire(root, names, WIRING))
    assert snapshot(root) == pristine


def test_a_port_that_does_not_fit_its_layer_is_refused_together_and_writes_nothing(tmp_path):
    root = copy_tree("v2", tmp_path)
    pristine = snapshot(root)
    specs, sources, names = _specs(rmsnorm_v2="rmsnorm", silu_mul_v2="silu_mul",
                                   embedding_v2="embedding", argmax_v2="rmsnorm")
    with pytest.raises(NameClash) as exc:
        wire.plan(root, specs, WIRING, names, sources=sources, runtime="v2")
    msg = str(exc.value)
    # v2 has embed_layer, not embedding_layer
    assert f"embedding_v2: wiring.port 'embedding': {PY} has no def embedding_layer(" in msg
    # the spec's silu_mul_v2 reads both halves of a row in one task, upstream's layer splits cols
    assert ("silu_mul_v2: wiring.port 'silu_mul': " in msg and "silu_mul_layer: its tensor 0 (input) "
            "is partitioned (1, -1, -1), the spec's input (-1, -1, -1)" in msg)
    assert "silu_mul_layer takes no cols, rpt" in msg       # its wiring.params
    assert "wiring.port 'rmsnorm': rmsnorm_layer is ported by argmax_v2 too" in msg
    assert snapshot(root) == pristine


def test_on_v1_a_porting_kernel_keeps_a_layer_of_its_own(tmp_path):
    root = copy_tree("mpk", tmp_path)
    specs, sources, names = _specs(rmsnorm_v2="rmsnorm")
    p = wire.plan(root, specs, WIRING, ["rmsnorm_v2"], sources=sources)
    layer = p.new_contents[PY]
    assert "    def rmsnorm_v2_layer(" in layer and "rmsnorm_v2/any/port" not in layer


def test_a_python_scope_ends_with_its_def(tmp_path):
    """The port's anchor is looked for in the named layer's body only: a layer without one
    is 'not supported', never a block in the next layer."""
    root = copy_tree("v2", tmp_path)
    from mpkbuild.wire.checkout import Checkout
    from mpkbuild.wire.surface import load_surface
    surface = load_surface(WIRING)
    site = next(s for s in surface.sites if s.id == "port")
    lines = ["class K:\n", "    def a_layer(\n", "        self,\n", "    ):\n", "        pass\n",
             "\n", "    def b_layer(self):\n", "        self.kn_graph.customized([x], tb_graph)\n"]
    co = Checkout(root, surface)
    anchor = surface.text(site.anchor, "anchor", kernel="k", arch={}, port="a")
    with pytest.raises(AnchorNotFound):
        co.find_anchor(PY, lines, site, anchor, r"^    def a_layer\(")
    assert co.find_anchor(PY, lines, site, anchor, r"^    def b_layer\(") == 7
