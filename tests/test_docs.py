"""The README and docs/ are a front door that leads somewhere: every page, file and script
they name exists, and every scons command line in their code blocks is one the tool takes
(its arguments, stages and commands), so a reader who copies one is never refused."""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO
from mpkbuild import stages

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# a path from the repository root: a doc, a script, a module, a spec (no placeholders)
ROOTED = re.compile(r"(?<![\w/.<-])((?:docs|bench|tests|kernels|specs|site_scons|tuned|"
                    r"perf_history|gpu_profiles|\.ci)/[\w./-]*[\w-]\.(?:md|py|sh|yaml|j2|json|cu|cuh))\b")
SIBLING = re.compile(r"(?<![\w/.<-])([\w-]+\.md)\b")
# names that stand for a kernel in examples (K, and the ones the walk-throughs create) and the
# files a build writes (build/K/review.md): not in the repository, by design
PLACEHOLDERS = {"K", "gelu_v2", "scale_v1", "my_op"}
BUILD_OUTPUTS = {"review.md", "summary.md"}


def _placeholder(path: str) -> bool:
    return any(part.split(".")[0] in PLACEHOLDERS for part in path.split("/"))
FENCE = re.compile(r"^```(?:sh|bash|console)?\n(.*?)^```", re.M | re.S)
SCONS_OPTIONS = re.compile(r"^(-[nQchk]|-j\d*|--json|--details|--dry-run|--help)$")


def _cli_names() -> tuple[set, set]:
    """ARGUMENT_NAMES and TARGET_NAMES as cli.py declares them (read, not imported: cli
    imports SCons.Script, which wants a running scons)."""
    tree = ast.parse((REPO / "site_scons/mpkbuild/cli.py").read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("COMMANDS", "ARGUMENT_NAMES"):
                values[name] = set(ast.literal_eval(node.value))
    return values["ARGUMENT_NAMES"], values["COMMANDS"] | {"mpk"}


def _scons_lines(text: str):
    for block in FENCE.findall(text):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if re.match(r"^(\.venv/bin/)?scons\b", line):
                yield line


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_and_file_a_page_names_exists(page):
    text = page.read_text()
    missing = [m for m in ROOTED.findall(text) if not (REPO / m).exists() and not _placeholder(m)]
    if page.parent.name == "docs":
        missing += [m for m in SIBLING.findall(text)
                    if not any((d / m).exists() for d in (page.parent, REPO, REPO / "bench"))
                    and m not in BUILD_OUTPUTS]
    links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", text)
    missing += [m for m in links if "://" not in m and not (page.parent / m).exists()]
    assert not missing, f"{page.relative_to(REPO)} names what is not there: {sorted(set(missing))}"


def test_the_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    unlinked = [p.name for p in (REPO / "docs").glob("*.md") if f"docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not lead to: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_scons_command_in_a_page_is_one_the_tool_takes(page):
    arguments, targets = _cli_names()
    bad = []
    for line in _scons_lines(page.read_text()):
        for word in shlex.split(line)[1:]:
            if "=" in word:
                key, value = word.split("=", 1)
                if key not in arguments:
                    bad.append(f"{line}: no argument {key}=")
                elif key == "stage" and value not in stages.NAMES:
                    bad.append(f"{line}: no stage {value}")
            elif word.startswith("-"):
                if not SCONS_OPTIONS.match(word):
                    bad.append(f"{line}: no option {word}")
            elif word not in targets:
                bad.append(f"{line}: no command {word}")
    assert not bad, "\n".join(bad)


def test_the_readme_is_a_front_door():
    """Two screens or so: what it is, the two commands, a walk, the commands people use,
    the stages, and where to read on."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    assert ".venv/bin/python -m pytest -q" in readme        # .ci/run's test command
    assert (REPO / ".ci/run").read_text().rstrip().endswith(".venv/bin/python -m pytest -q")
