"""The stand-in GPU executor answers with results of the real runners' shape: every key the
perf runner writes for a variant, its figures and its slowCTA, read from the runner's code,
is in the stand-in's result (it completes its figures with the runner's own functions), so a
build-side reader that passes against the stand-in reads what a real GPU run writes."""
import ast
import inspect
import os
import sys

sys.path.insert(0, str(__import__("conftest").FAKES))

import fake_gpu  # noqa: E402
from mpkbuild.runners import perf as perf_runner  # noqa: E402
from mpkbuild.runners import timing  # noqa: E402

PCFG = {"baseline": "kernels/k/reference.py:ref", "repeats": 7,
        "baselines": [{"name": "torch_compile", "function": "kernels/k/reference.py:ref", "compile": True}]}


def keys_written(function, name: str) -> set[str]:
    """The string keys `name[...] = ...`, `name.update(k=...)` and f-string keys (with the
    figure names filled in) that a function (or a module) of the runner writes."""
    tree = ast.parse(inspect.getsource(function))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == name:
            key = node.slice
            if isinstance(key, ast.Constant):
                out.add(key.value)
            elif isinstance(key, ast.JoinedStr):
                for fig in ("hot", "cold"):
                    out.add("".join(fig if isinstance(v, ast.FormattedValue) else v.value for v in key.values))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == name:
            out.update(kw.arg for kw in node.keywords)
    return out


def returned_keys(function) -> set[str]:
    """The keys of the dict literal(s) a function returns."""
    out = set()
    for node in ast.walk(ast.parse(inspect.getsource(function))):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            out.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return out


def test_the_variant_result_has_every_key_the_perf_runner_writes():
    variant = fake_gpu._figures(0.5, PCFG)
    written = keys_written(perf_runner, "result")       # perf_variant and the helpers it fills it with
    # the dict literal the result starts from
    for node in ast.walk(ast.parse(inspect.getsource(perf_runner.perf_variant))):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "result" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            written |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    assert {"bytes", "ceiling", "baselines", "hot", "cold", "slowcta", "hot_bandwidth_fraction",
            "vs_baseline_cold", "timings_s"} <= written, written     # the scan itself works
    assert written <= set(variant), sorted(written - set(variant))


def test_figures_slowcta_and_baselines_have_the_runner_shape():
    variant = fake_gpu._figures(0.5, PCFG)
    for fig in ("hot", "cold"):
        assert returned_keys(timing.figure) <= set(variant[fig])
        assert returned_keys(timing.sampling_info) <= set(variant[fig]["sampling"])
    assert returned_keys(perf_runner.slow_cta) <= set(variant["slowcta"])
    entry_keys = {"name", "function", "compile"}          # runners/perf.prepared_baselines' entry
    for name in ("torch", "torch_compile"):
        assert entry_keys | {"hot", "cold", "vs_hot", "vs_cold"} <= set(variant["baselines"][name])
