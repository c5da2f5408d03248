"""A project: the folder whose SConstruct loads the mpk tool, and its mpkbuild.yaml.

Every key of mpkbuild.yaml is optional; without the file a project has the default layout
(specs/, kernels/, build/, gpu_profiles/, tuned/, perf_history/, wiring/). The file is the
one place a project changes where its folders are, and the checkout it wires into by
default (a project kept inside a Mirage checkout names that checkout). It is read before
anything is planned; an error in it names the file, line and key and stops the run.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from mpkbuild.model.yamlpos import YamlPosError, format_path, line_for, load_with_lines
from mpkbuild.util import config

# mpkbuild.yaml keys beyond the folders (config.LAYOUT_KEYS)
OPTION_KEYS = ("mpk_root",)


class ProjectError(Exception):
    """mpkbuild.yaml cannot be used: names the file, the line and the key."""

    def __init__(self, file: str, line: int, path, message: str):
        super().__init__(f"{file}:{line}: {format_path(tuple(path))}: {message}")


@dataclass(frozen=True)
class Project:
    root: Path
    layout: dict          # mpkbuild.yaml key -> folder, relative to root
    mpk_root: Path | None  # the checkout stage=wire/runtime use when mpk_root= is not given
    file: Path | None     # mpkbuild.yaml, when the project has one


def load(root: Path | str) -> Project:
    """The project at root: its mpkbuild.yaml checked, nothing set or written."""
    root = Path(root)
    path = root / config.PROJECT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Project(root, dict(config.DEFAULT_LAYOUT), None, None)
    except OSError as exc:
        raise ProjectError(config.PROJECT_FILE, 1, (), f"cannot read it: {exc.strerror}") from None
    try:
        data, lines = load_with_lines(text)
    except YamlPosError as exc:
        raise ProjectError(config.PROJECT_FILE, exc.line, exc.path, exc.message) from None

    def fail(key_path: tuple, message: str):
        raise ProjectError(config.PROJECT_FILE, line_for(lines, key_path), key_path, message)

    if data is None:
        data = {}
    if not isinstance(data, dict):
        fail((), "must be a mapping of keys (folders: "
             f"{', '.join(config.LAYOUT_KEYS)}; and {', '.join(OPTION_KEYS)})")
    known = (*config.LAYOUT_KEYS, *OPTION_KEYS)
    for key in data:
        if key not in known:
            import difflib
            close = difflib.get_close_matches(str(key), known, n=1)
            fail((key,), f"unknown key{f'; did you mean {close[0]!r}?' if close else ''} "
                 f"(keys: {', '.join(known)})")
    layout = dict(config.DEFAULT_LAYOUT)
    for key in config.LAYOUT_KEYS:
        if key in data:
            layout[key] = _folder(data[key], lambda m, k=key: fail((k,), m))
    taken = {}
    for key, folder in layout.items():
        if folder in taken:
            fail((key,), f"{folder!r} is also the {taken[folder]} folder: each needs its own")
        taken[folder] = key
    mpk_root = None
    if "mpk_root" in data:
        value = data["mpk_root"]
        if not isinstance(value, str) or not value.strip():
            fail(("mpk_root",), "must be a path (relative to this file, or absolute)")
        mpk_root = (root / value).resolve()
        if not mpk_root.is_dir():
            fail(("mpk_root",), f"{mpk_root} is not a folder")
    return Project(root, layout, mpk_root, path)


def _folder(value, fail) -> str:
    """A folder of the project, relative to its root, normalised (no '..', no absolute)."""
    if not isinstance(value, str) or not value.strip():
        fail("must be a folder name, relative to the project")
    norm = posixpath.normpath(value.strip().replace("\\", "/"))
    if posixpath.isabs(norm) or norm == "." or norm == ".." or norm.startswith("../"):
        fail(f"{value!r}: must be a folder inside the project (relative, not '.', no '..')")
    return norm


def use_project(root: Path | str) -> Project:
    """Load the project at root and put its layout in force (config's folder names)."""
    project = load(root)
    config.use_layout(project.layout)
    return project
