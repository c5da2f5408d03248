"""A project's own layout (mpkbuild.yaml), its default checkout, and what a torch change
says: read by the library and by a real scons in a copy of this project."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import REPO, copy_project
from mpkbuild.model import project as project_mod
from mpkbuild.util import config


@pytest.fixture(autouse=True)
def default_layout():
    """load/use_project change config's folder names for the process: put them back."""
    yield
    config.use_layout({})


def test_no_file_is_the_default_layout(tmp_path):
    p = project_mod.load(tmp_path)
    assert p.layout == config.DEFAULT_LAYOUT and p.mpk_root is None and p.file is None


def test_the_file_sets_folders_and_the_default_checkout(tmp_path):
    (tmp_path / "mirage").mkdir()
    (tmp_path / "mpkbuild.yaml").write_text("build: out/mpk\nspecs: kernel_specs/\nmpk_root: mirage\n")
    p = project_mod.use_project(tmp_path)
    assert p.layout["build"] == "out/mpk" and p.layout["specs"] == "kernel_specs"
    assert p.mpk_root == (tmp_path / "mirage").resolve()
    assert config.BUILD_DIRNAME == "out/mpk" and config.SPEC_DIRNAME == "kernel_specs"
    assert config.TUNED_DIRNAME == "tuned"                   # not given: the default


@pytest.mark.parametrize("text,where", [
    ("buidl: out\n", "mpkbuild.yaml:1: buidl: unknown key; did you mean 'build'?"),
    ("specs: specs\nbuild: ../elsewhere\n", "mpkbuild.yaml:2: build: '../elsewhere': must be a folder inside the project"),
    ("build: /tmp/x\n", "mpkbuild.yaml:1: build: '/tmp/x': must be a folder inside the project"),
    ("build: .\n", "mpkbuild.yaml:1: build: '.': must be a folder inside the project"),
    ("tuned: results\nperf_history: results\n", "mpkbuild.yaml:2: perf_history: 'results' is also the tuned folder"),
    ("build: 3\n", "mpkbuild.yaml:1: build: must be a folder name"),
    ("mpk_root: nowhere\n", "mpkbuild.yaml:1: mpk_root: "),
    ("- build\n", "mpkbuild.yaml:1: <top>: must be a mapping"),
    ("build: [\n", "mpkbuild.yaml:"),
])
def test_a_bad_project_file_names_file_line_and_key(tmp_path, text, where):
    (tmp_path / "mpkbuild.yaml").write_text(text)
    with pytest.raises(project_mod.ProjectError) as err:
        project_mod.use_project(tmp_path)
    assert str(err.value).startswith(where), str(err.value)
    in_force = {key: getattr(config, name) for key, name in config.LAYOUT_KEYS.items()}
    assert in_force == config.DEFAULT_LAYOUT                   # nothing was put in force


def test_a_project_builds_in_its_own_folders(tmp_path):
    """specs in kernel_specs/, outputs in out/: generate, status and -n all use them, and
    nothing appears under build/ or specs/."""
    p = copy_project(tmp_path / "proj")
    shutil.move(p.path("specs"), p.path("kernel_specs"))
    p.path("mpkbuild.yaml").write_text("specs: kernel_specs\nbuild: out\n")
    run = p.scons("kernel=rmsnorm_v2", "stage=generate")
    assert "generate rmsnorm_v2 rmsnorm_v2.cuh" in run.actions
    assert p.path("out/rmsnorm_v2/gen/rmsnorm_v2.cuh").is_file()
    assert not p.path("build").exists() and not p.path("specs").exists()
    status = json.loads(p.scons("status", "--json", "stage=generate").stdout)
    assert status["nodes"] and all(not n["will_run"] for n in status["nodes"]), status
    assert p.scons("-n", "stage=generate").stdout.strip() == ""
    p.edit("kernel_specs/rmsnorm_v2.yaml", "rel_max:", "rel_max: 0.02 #")
    assert "spec rmsnorm_v2" in p.scons("-n", "stage=generate").stdout


def test_the_project_checkout_is_the_default_mpk_root_and_not_remembered(tmp_path):
    p = copy_project(tmp_path / "proj")
    tree = tmp_path / "mirage"
    shutil.copytree(REPO / "tests" / "fixtures" / "mpk_tree", tree)
    p.path("mpkbuild.yaml").write_text(f"mpk_root: {tree}\n")
    run = p.scons("-n", "kernel=rmsnorm_v2", "stage=wire")
    assert "wire rmsnorm_v2" in run.stdout
    p.scons("kernel=rmsnorm_v2", "stage=wire")
    manifest = json.loads(p.path("build/rmsnorm_v2/wiring/wire.json").read_text())
    assert manifest["mode"] == "diff" and manifest["mpk_root"] == str(tree), manifest
    options = p.path("build/options.py")
    assert "mpk_root" not in (options.read_text() if options.exists() else "")
    # `mpk_root=` runs without a checkout: render mode
    p.scons("kernel=rmsnorm_v2", "stage=wire", "mpk_root=")
    manifest = json.loads(p.path("build/rmsnorm_v2/wiring/wire.json").read_text())
    assert manifest["mode"] != "diff" and not manifest.get("mpk_root"), manifest


def test_a_torch_change_is_said_as_such(built):
    """torch's major.minor is in the GPU fact: every GPU gate is stale, and status says the
    results were taken with another torch."""
    run = built.scons("status", "--json", "stage=validate", env={"FAKE_GPU_TORCH": "2.13.0"})
    nodes = {n["label"]: n for n in json.loads(run.stdout)["nodes"]}
    gate = next(n for label, n in nodes.items() if label.startswith("validate rmsnorm_v2"))
    assert gate["will_run"]
    assert any(r.startswith("torch 0.0 -> 2.13: results taken with another torch are another GPU profile's")
               for r in gate["reasons"]), gate["reasons"]
    assert not nodes["compile rmsnorm_v2 sm_90a"]["will_run"]


def test_init_inside_a_mirage_checkout_names_it_as_the_default_mpk_root(tmp_path):
    from mpkbuild.__main__ import init
    tree = tmp_path / "mirage"
    shutil.copytree(REPO / "tests" / "fixtures" / "mpk_tree", tree)
    init(tree / "kernels-of-ours")
    project = project_mod.load(tree / "kernels-of-ours")
    assert project.mpk_root == tree.resolve()
    alone = tmp_path / "alone"
    init(alone)
    assert project_mod.load(alone).mpk_root is None


def test_init_refuses_where_a_project_is_and_writes_nothing(tmp_path):
    from mpkbuild.__main__ import InitError, init
    (tmp_path / "SConstruct").write_text("# mine\n")
    with pytest.raises(InitError, match="SConstruct already there"):
        init(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SConstruct"]


def test_this_repository_loads_the_tool_as_init_writes_it():
    """The catalog is a project like a user's: its SConstruct's code is init's."""
    from mpkbuild.__main__ import PROJECT_TEMPLATES
    code = lambda text: [l.split("#")[0].rstrip() for l in text.splitlines()
                         if l.split("#")[0].strip()]
    assert code((REPO / "SConstruct").read_text()) == code((PROJECT_TEMPLATES / "SConstruct.j2").read_text())
