"""The plugin as a user gets it: the wheel built from this checkout, installed into a new
virtual environment outside the repository, a project made by `mpkbuild init`, and the
commands of docs/plugin.md's quick start and README's "Your own repository", run as they are
written (only `path/to/mpkbuild` and `path/to/mirage` filled in). Then the same project with
a wiring/ of its own. Needs nvcc (compile) and PyPI (the wheel's dependencies)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.nvcc
PINNED = REPO.parent / "shared" / "mirage" / "mpk"
MARK = "@@@ "


def doc_block(path: Path, heading: str) -> list[str]:
    """The command lines of the first ```sh block under `heading` (a markdown heading)."""
    text = path.read_text()
    at = text.index(heading + "\n")
    block = re.search(r"```sh\n(.*?)```", text[at:], re.S)
    assert block, f"{path.name}: no ```sh block under {heading!r}"
    return [line for line in block.group(1).splitlines() if line.strip()]


def run_block(lines: list[str], cwd: Path, fill: dict[str, str]) -> dict[str, str]:
    """Each line in one bash (cd and activate carry over), stopping at the first that fails;
    returns each line's output (stdout and stderr) by the line as written."""
    script = ["set -e"]
    for line in lines:
        filled = line
        for placeholder, value in fill.items():
            filled = filled.replace(placeholder, value)
        script += [f"echo {MARK}{len(script)}", filled]
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SCONSFLAGS")}
    nvcc = Path(shutil.which("nvcc")).parent
    env["PATH"] = os.pathsep.join([str(nvcc), "/usr/local/bin", "/usr/bin", "/bin"])
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    chunks = re.split(rf"^{MARK}\d+\n", proc.stdout + "\n" + proc.stderr, flags=re.M)
    outputs = dict(zip(lines, chunks[1:]))
    assert proc.returncode == 0, (f"the block stopped at {lines[len(outputs) - 1]!r} "
                                  f"(exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return outputs


def digest(tree: Path) -> dict[str, str]:
    return {p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


def _repo_entries() -> set[str]:
    return {p.relative_to(REPO).as_posix() for folder in (REPO, REPO / "site_scons")
            for p in folder.iterdir()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built as CI builds it; building it writes nothing into this checkout."""
    before = _repo_entries()
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(dist), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _repo_entries() == before, f"the wheel build wrote {sorted(_repo_entries() - before)}"
    (found,) = dist.glob("mpkbuild-*.whl")
    return found


@pytest.fixture(scope="module")
def user(wheel, tmp_path_factory) -> dict:
    """docs/plugin.md's quick start, run word for word in a folder outside the repository."""
    if not PINNED.is_dir():
        pytest.skip(f"the pinned Mirage tree is not at {PINNED}")
    from test_wire_real import copy_tree
    home = tmp_path_factory.mktemp("user")
    mirage = copy_tree("mpk", home)
    pristine = digest(mirage)
    lines = doc_block(REPO / "docs" / "plugin.md", "## Quick start")
    out = run_block(lines, home, {"path/to/mpkbuild": str(wheel), "path/to/mirage": str(mirage)})
    return {"home": home, "project": home / "my-kernels", "mirage": mirage, "pristine": pristine,
            "out": out, "lines": lines, "wheel": wheel}


def output(user: dict, starts: str) -> str:
    return next(v for k, v in user["out"].items() if k.startswith(starts))


def test_the_package_comes_from_the_wheel_not_this_checkout(user):
    venv_python = user["home"] / ".venv" / "bin" / "python"
    where = subprocess.run([str(venv_python), "-c", "import mpkbuild; print(mpkbuild.__file__)"],
                           capture_output=True, text=True, cwd=user["home"], env={"PATH": "/usr/bin:/bin"})
    assert "site-packages" in where.stdout and str(REPO) not in where.stdout, where


def test_init_writes_a_project_that_loads_the_installed_tool(user):
    project = user["project"]
    for rel in ("SConstruct", "mpkbuild.yaml", ".gitignore", ".ci/run", "specs/scale_v1.yaml",
                "kernels/scale_v1/scale_v1.cuh.j2", "kernels/scale_v1/reference.py"):
        assert (project / rel).is_file(), rel
    sconstruct = (project / "SConstruct").read_text()
    assert "toolpath=[mpkbuild.toolpath()]" in sconstruct
    assert not (project / "site_scons").exists()      # nothing of the package is copied
    assert os.access(project / ".ci/run", os.X_OK)


def test_compile_status_dry_run_why_and_dag_from_the_new_project(user):
    compiled = user["out"]["scons"]
    assert re.search(r"scale_v1\s+compile sm_90a\s+pass", compiled), compiled
    assert re.search(r"scale_v1\s+compile sm_100a\s+pass", compiled), compiled
    assert (user["project"] / "build/scale_v1/sm_90a/libscale_v1.so").is_file()
    status = user["out"]["scons status"]
    assert re.search(r"scale_v1\s+fresh\s+fresh\s+fresh\s+fresh", status), status
    dry = output(user, "scons -n")
    assert "validate scale_v1" in dry and "review scale_v1" in dry and "compile scale_v1" not in dry, dry
    why = output(user, "scons why=")
    assert "validate scale_v1" in why and "compile scale_v1" not in why, why
    assert (user["project"] / "build/dag/scale_v1-review.dot").is_file()


def test_wire_applies_and_unwires_the_pinned_tree_byte_exactly(user):
    applied = user["out"]["scons stage=wire mpk_root=path/to/mirage apply=1"]
    assert re.search(r"wire scale_v1: applied to [1-9]\d* files", applied), applied
    unwired = user["out"]["scons stage=wire mpk_root=path/to/mirage apply=1 unwire=1"]
    assert "unwired from" in unwired, unwired
    assert digest(user["mirage"]) == user["pristine"]
    # and once more by hand: applied twice is applied once, and unwired is the pristine tree
    mirage = user["mirage"]
    assert _scons(user, "stage=wire", f"mpk_root={mirage}", "apply=1").returncode == 0
    once = digest(mirage)
    assert once != user["pristine"]
    assert _scons(user, "stage=wire", f"mpk_root={mirage}", "apply=1").returncode == 0
    assert digest(mirage) == once
    assert _scons(user, "stage=wire", f"mpk_root={mirage}", "apply=1", "unwire=1").returncode == 0
    assert digest(mirage) == user["pristine"]


def test_the_readme_quick_start_works_as_written(user, tmp_path):
    lines = doc_block(REPO / "README.md", "## Your own repository")
    venv = user["home"] / ".venv" / "bin"
    run_block([f". {venv}/activate", *lines], tmp_path, {"path/to/mpkbuild": str(user["wheel"]),
                                                         "path/to/mirage": str(user["mirage"])})
    assert (tmp_path / "my-kernels" / "build" / "scale_v1" / "sm_90a" / "resources.json").is_file()


def _scons(user: dict, *args: str) -> subprocess.CompletedProcess:
    venv = user["home"] / ".venv" / "bin"
    nvcc = Path(shutil.which("nvcc")).parent
    env = {"PATH": os.pathsep.join([str(venv), str(nvcc), "/usr/bin", "/bin"]), "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run([str(venv / "scons"), "-Q", *args], cwd=user["project"], env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_project_wiring_folder_overrides_the_shipped_surface(user):
    """wiring/surface.yaml drops the profiler site, wiring/templates/layer.py.j2 replaces the
    shipped layer: the diff follows both, -n names the wire node once they change, and apply
    twice and unwire leave the checkout as before."""
    import mpkbuild.util.config as config
    project, mirage = user["project"], user["mirage"]
    own = project / "wiring"
    (own / "templates").mkdir(parents=True)
    (own / "surface.yaml").write_text("sites:\n  - id: profiler\n    drop: true\n")
    shipped = (config.SHIPPED_WIRING / "templates" / "layer.py.j2").read_text()
    marker = "    # reviewed by the kernel team\n"
    assert "    tb_graph = TBGraph(" in shipped
    (own / "templates" / "layer.py.j2").write_text(shipped.replace("    tb_graph = TBGraph(", marker + "    tb_graph = TBGraph(", 1))
    dry = _scons(user, "-n", "stage=wire", "mpk_root=")
    assert dry.returncode == 0 and "wire scale_v1" in dry.stdout, dry.stdout + dry.stderr
    first = _scons(user, "stage=wire", f"mpk_root={mirage}", "apply=1")
    assert first.returncode == 0, first.stdout + first.stderr
    changed = {rel for rel, sha in digest(mirage).items() if user["pristine"].get(rel) != sha}
    assert "python/mirage/mpk/profiler_persistent.py" not in changed, changed
    layer_files = [rel for rel in changed if rel.endswith("persistent_kernel.py")]
    assert layer_files and marker.strip() in (mirage / layer_files[0]).read_text()
    once = digest(mirage)
    again = _scons(user, "stage=wire", f"mpk_root={mirage}", "apply=1")
    assert again.returncode == 0 and digest(mirage) == once, again.stdout + again.stderr
    gone = _scons(user, "stage=wire", f"mpk_root={mirage}", "apply=1", "unwire=1")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert digest(mirage) == user["pristine"]


def test_a_bad_project_file_is_one_located_error_and_nothing_is_written(user):
    project = user["project"]
    before = digest(project / "build")
    original = (project / "mpkbuild.yaml").read_text()
    try:
        (project / "mpkbuild.yaml").write_text(original + "buidl: out\n")
        run = _scons(user, "status")
        assert run.returncode == 2
        line = len(original.splitlines()) + 1
        assert f"mpkbuild.yaml:{line}: buidl: unknown key; did you mean 'build'?" in run.stderr, run.stderr
        assert digest(project / "build") == before
    finally:
        (project / "mpkbuild.yaml").write_text(original)
