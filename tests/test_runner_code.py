"""A gate's code input is the import closure of its runner, its judge and the build side
that records it: a behaviour edit of any module there makes exactly the results that module
can change stale (issue 28: a hand-kept list missed runners/gpuwait.py for every gate and
runners/timing.py for the bandwidth node), and a comment or docstring edit makes nothing
stale (issue 39: a comment in stages/compile.py recompiled every library)."""
import pytest

from mpkbuild.util.closure import module_files
from mpkbuild.util.config import PACKAGE_DIR

pytestmark = pytest.mark.nvcc

K = "rmsnorm_v2"
GPU = "fake-gpu-sm90"
VALIDATE, PERF, BANDWIDTH = f"validate {K} {GPU}", f"perf {K} {GPU}", f"bandwidth {GPU}"
ALL = {VALIDATE, PERF, BANDWIDTH}

# module edited -> the GPU nodes that must become stale (perf reads the bandwidth node's
# result, so whatever re-measures the bandwidth re-times perf too)
EXPECTED = {
    "runners/__init__.py": ALL,          # imported before any runner: starts the lifeline
    "runners/lifeline.py": ALL,
    "runners/common.py": ALL,
    "runners/facts.py": ALL,             # the resolved facts of the job (common reads them)
    "runners/gpuwait.py": ALL,           # sets the context flags timing depends on
    "runners/validate.py": {VALIDATE},
    "runners/perf.py": {PERF},
    "runners/placement.py": {PERF},      # the buffer placements the hot figure is timed over
    "runners/timing.py": {PERF, BANDWIDTH},
    "runners/gpustate.py": {PERF, BANDWIDTH},   # NVML clocks: perf and the bandwidth node read them
    "runners/bandwidth.py": {PERF, BANDWIDTH},
    "util/stats.py": {PERF, BANDWIDTH},          # the intervals
    "util/perfspec.py": {PERF},                  # the judge's view of the perf section
    "util/expr.py": ALL,                 # shapes and sizes every runner evaluates
    "util/fsutil.py": ALL,               # the result file's atomic write
    "stages/perf/judge.py": {PERF},      # the build-side judge of perf's figures
    "runners/runtime.py": set(),         # the runtime gate: not in this graph (no mpk_root=)
    "runners/launch.py": set(),          # the cold-start shim: runs a runner, computes nothing
    "runners/trial.py": set(),           # the tune stage's trials only (not a validate/perf result)
    "runners/profile.py": set(),         # the profile gate: rmsnorm_v2 asks for no profile
    "stages/review.py": set(),
    # the build side of a gate: what writes and judges its result
    "stages/gates.py": ALL,              # record(): the result file and its input lock
    "run/job.py": ALL,                   # the job, the watchdog
    "gpu.py": ALL,                       # the fingerprint a result records
    "model/paths.py": ALL,               # where results are
    "util/toolchain.py": ALL,            # the toolchain fact (compile too)
    "stages/perf/ledger.py": {PERF},     # the ledger perf is judged against
    "stages/perf/report.py": set(),      # the review's and status's, never a reason to re-time
    "stages/compile.py": {VALIDATE, PERF},   # a new library: the gates that load it
    "stages/generate/plan.py": {VALIDATE, PERF},   # compile's resource gate reads the SMEM plan through it
    # the spec loader reaches an output only through the data it loads (the spec's digest)
    "model/spec.py": set(),
    "stages/perf/section.py": set(),
    "wire/patch.py": set(),              # the wire engine: no gate reads it
    # plumbing (util/closure.PLUMBING): plans and dispatches, writes no result
    "cli.py": set(),
    "status.py": set(),
    "model/graph.py": set(),
    "stages/__init__.py": set(),
}


def test_every_runner_module_is_in_the_table_below():
    runners = {f"runners/{p.name}" for p in (PACKAGE_DIR / "runners").glob("*.py")}
    assert runners <= set(EXPECTED), f"add a row for {sorted(runners - set(EXPECTED))}"


def test_the_closure_follows_relative_lazy_and_package_imports():
    files = {p.relative_to(PACKAGE_DIR).as_posix() for p in module_files("mpkbuild.runners.bandwidth")}
    assert {"__init__.py", "runners/__init__.py", "runners/lifeline.py", "runners/timing.py",
            "runners/gpuwait.py", "runners/common.py", "runners/facts.py"} <= files
    assert "runners/validate.py" not in files and "model/spec.py" not in files
    assert "util/expr.py" not in files             # the build resolves the spec's expressions


def stale_gpu_nodes(p) -> set[str]:
    import json
    run = p.scons("status", "--json", "stage=review")
    return {n["label"] for n in json.loads(run.stdout)["nodes"] if n["will_run"]} & ALL


def stale_nodes(p) -> set[str]:
    import json
    run = p.scons("status", "--json", "stage=review")
    return {n["label"] for n in json.loads(run.stdout)["nodes"] if n["will_run"]}


def test_editing_a_module_makes_exactly_its_gates_stale(built):
    assert stale_nodes(built) == set()
    for rel, expected in EXPECTED.items():
        path = built.path(f"site_scons/mpkbuild/{rel}")
        original = path.read_bytes()
        path.write_bytes(original + b"\n_edited_by_the_test = 1\n")
        try:
            assert stale_gpu_nodes(built) == expected, rel
        finally:
            path.write_bytes(original)
    assert stale_nodes(built) == set()


def test_comment_and_docstring_edits_make_nothing_stale(built):
    for rel in EXPECTED:
        path = built.path(f"site_scons/mpkbuild/{rel}")
        original = path.read_text()
        # a comment line, and the module's docstring reworded (where it has one)
        edited = original.replace('"""', '"""Reworded. ', 1) if original.lstrip().startswith('"""') else original
        path.write_text(edited + "\n# edited by the test\n")
    assert stale_nodes(built) == set()


def test_the_import_scan_finds_every_import_a_full_parse_finds():
    """closure parses only import statements (fast); over the whole package it must see
    every mpkbuild import that parsing each module whole sees."""
    import ast
    from mpkbuild.util import closure
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        full = set()
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                full.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - max(node.level - 1, 0)]
                origin = ".".join(base + [node.module or ""]).strip(".") if node.level else node.module
                full.add(origin)
                full.update(f"{origin}.{a.name}" for a in node.names)
        full = {n for n in full if n.split(".")[0] == "mpkbuild"}
        assert full <= closure._parse_imports(path.read_text(), path, module), path
