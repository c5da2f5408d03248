"""Shared fixtures: a temporary copy of the project and a runner for real `scons` in it."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAKES = Path(__file__).resolve().parent / "fakes"
COPIED = ("SConstruct", "site_scons", "specs", "kernels", "pyproject.toml")

def _action_re() -> re.Pattern:
    """An action line the build prints: a stage of the table (or the per-GPU bandwidth
    node), a kernel, maybe one detail (the arch, the GPU, the file)."""
    from mpkbuild import stages
    names = "|".join((*stages.NAMES, "bandwidth"))
    return re.compile(rf"^({names})\s{{1,9}}(\S+)(?: (\S+))?$")


ACTION_RE = _action_re()


def has_nvcc() -> bool:
    return shutil.which("nvcc") is not None


def has_gpu() -> tuple[bool, str]:
    if shutil.which("nvidia-smi") is None:
        return False, "no nvidia-smi on this machine"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA GPU"
    return True, ""


def pytest_collection_modifyitems(config, items):
    gpu_ok, why = has_gpu()
    for item in items:
        if "gpu" in item.keywords and not gpu_ok:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {why}; run it on the GPU box"))
        if "nvcc" in item.keywords and not has_nvcc():
            item.add_marker(pytest.mark.skip(reason="needs nvcc on PATH"))


@dataclass
class SconsRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def actions(self) -> list[str]:
        """The executed (or, with -n, listed) actions, one 'stage kernel [detail]' each."""
        out = []
        for line in self.stdout.splitlines():
            m = ACTION_RE.match(line)
            if m:
                out.append(" ".join(g for g in m.groups() if g))
        return out


class Project:
    """A throwaway copy of the project, with `scons` run in it as a user would."""

    def __init__(self, root: Path):
        self.root = root
        self.runs_file = root / "fake-gpu-runs.txt"

    def path(self, rel: str) -> Path:
        return self.root / rel

    def gate_result(self, kernel: str, gate: str) -> dict:
        """The one result of a GPU gate (build/<kernel>/gpu/<gpu>/<gate>.json)."""
        (found,) = (self.root / "build" / kernel / "gpu").glob(f"*/{gate}.json")
        return json.loads(found.read_text())

    def edit(self, rel: str, old: str, new: str) -> None:
        p = self.path(rel)
        text = p.read_text()
        assert old in text, f"{old!r} not in {rel}"
        p.write_text(text.replace(old, new, 1))

    def scons(self, *args: str, fake_gpu: bool = True, env: dict | None = None,
              check: bool = True, timeout: int = 600) -> SconsRun:
        cmd = [sys.executable, "-m", "SCons", "-Q", *args]
        if fake_gpu:
            cmd.append("executor=fake_gpu:FakeGpuExecutor")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
        full_env["PYTHONPATH"] = os.pathsep.join([str(FAKES), str(self.root / "site_scons")]
                                                 + [p for p in [os.environ.get("PYTHONPATH")] if p])
        full_env["FAKE_GPU_RUNS"] = str(self.runs_file)
        full_env.update(env or {})
        proc = subprocess.run(cmd, cwd=self.root, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
        run = SconsRun(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"scons {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return run


def process_alive(pid: int) -> bool:
    """Running, not a zombie (a reaped-later child is dead for a test's purposes)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def eventually(check, timeout: float = 15.0) -> bool:
    """Polls `check` every 0.1 s until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def assert_processes_gone(pids, within: float = 10.0, what: str = "runner") -> None:
    assert pids, f"the {what} never started"
    assert eventually(lambda: not any(process_alive(p) for p in pids), timeout=within), \
        f"{what} still alive: {pids}"


def copy_project(dest: Path, kernels: tuple[str, ...] | None = ("rmsnorm_v2",)) -> Project:
    """Copy the project; only the named kernels' specs and sources (None: every kernel)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if name in ("specs", "kernels") and kernels is not None:
            (dest / name).mkdir()
            for k in kernels:
                if name == "specs":
                    shutil.copy2(src / f"{k}.yaml", dest / name / f"{k}.yaml")
                else:
                    shutil.copytree(src / k, dest / name / k, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    return Project(dest)


def stand_in_runners(folder: Path, package: str, bodies: dict[str, str], monkeypatch) -> None:
    """Runner modules `<package>.<name>` written under `folder`, importable here and in the
    runner processes the executors start."""
    pkg = folder / package
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, body in bodies.items():
        (pkg / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))


def stand_in_tree(root: Path) -> Path:
    """A kernel tree a gate job can point into: kernel k's reference and a pretend library."""
    (root / "kernels/k").mkdir(parents=True)
    (root / "kernels/k/reference.py").write_text("def ref(x):\n    return x\n")
    (root / "build/k/sm_90a").mkdir(parents=True)
    (root / "build/k/sm_90a/libk.so").write_bytes(b"\x7fELF not really a library")
    return root


@pytest.fixture(autouse=True)
def fresh_gpu_query():
    """gpu.py reads nvidia-smi once per process (each scons run is one); tests swap the
    stand-in nvidia-smi and its GPU count between tests in one process."""
    from mpkbuild import gpu as gpu_mod
    gpu_mod.smi_rows.cache_clear()
    gpu_mod.detect.cache_clear()
    yield
    gpu_mod.smi_rows.cache_clear()
    gpu_mod.detect.cache_clear()


@pytest.fixture
def root(tmp_path) -> Path:
    """A bare copy of specs/ and kernels/ (rmsnorm_v2 only) for library-level tests."""
    return copy_project(tmp_path / "specs-only", kernels=("rmsnorm_v2",)).root


def stop_warm_servers(root: Path) -> list[int]:
    """Ends the warm servers that builds in `root` started (a server runs in its build's
    folder). Each test's copy of the code is its own server, which would otherwise sit
    idle for MPK_WARM_IDLE_S with torch imported. Its forked children share its command
    line and folder, so they are stopped with it."""
    stopped = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"mpkbuild.run.warm" not in (entry / "cmdline").read_bytes():
                continue
            if not Path(os.readlink(entry / "cwd")).is_relative_to(root):
                continue
            os.kill(int(entry.name), signal.SIGTERM)
            stopped.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return stopped


@pytest.fixture(scope="session", autouse=True)
def _no_warm_server_outlives_the_tests(tmp_path_factory):
    """Module fixtures' projects (and any a test made itself) live under the base temp."""
    yield
    stop_warm_servers(tmp_path_factory.getbasetemp())


@pytest.fixture
def project(tmp_path):
    """A copy holding rmsnorm_v2 only: the contract tests count its actions exactly."""
    yield copy_project(tmp_path / "proj")
    stop_warm_servers(tmp_path / "proj")


@pytest.fixture
def project_all(tmp_path):
    """A copy holding every kernel of the catalog."""
    yield copy_project(tmp_path / "proj", kernels=None)
    stop_warm_servers(tmp_path / "proj")


@pytest.fixture(scope="module")
def built_project(tmp_path_factory) -> Project:
    """A copy already built through review with the stand-in GPU (shared by a module)."""
    proj = copy_project(tmp_path_factory.mktemp("built") / "proj")
    proj.scons("-j2", "stage=review")
    yield proj
    stop_warm_servers(proj.root)


def clone_built(built: Project, dest: Path) -> Project:
    """Copy an already-built project (build/ and .sconsign included) to a fresh place."""
    shutil.copytree(built.root, dest, symlinks=True)
    return Project(dest)


@pytest.fixture
def built(built_project, tmp_path) -> Project:
    """A private, already-built copy: tests may edit it freely."""
    return clone_built(built_project, tmp_path / "proj")
