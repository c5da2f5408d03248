"""The scaffold: a new kernel's spec, body template and reference, from one family's starter.

:func:`create` renders ``templates/scaffold/`` (one body per family A-E, a spec and a
reference shared by all with family-specific parts) and writes ``specs/<name>.yaml``,
``kernels/<name>/<name>.cuh.j2`` and ``kernels/<name>/reference.py``. The starter op is the
same for every family (``output = input * scale``, bf16, one row per task) so that the new
kernel builds through ``stage=compile`` at once and passes validate as it stands; the
family decides the body's structure (SMEM staging, regions, helper). Everything is rendered
before anything is written, so a refusal (:class:`ScaffoldError`) leaves the tree as it was.

The scaffold templates use ``[[ ]]`` / ``<% %>`` / ``<# #>`` delimiters (PTX operands look
like ``[%0]``): the files they produce are
themselves jinja templates (``{{ kernel }}``) rendered later by the generate stage.
"""
from __future__ import annotations

import keyword
import re
from pathlib import Path

import jinja2

from mpkbuild.util import config

SCAFFOLD_DIR = config.TEMPLATE_DIR / "scaffold"
FAMILIES = {
    "A": "warp-role pipeline: a producer warp fills a ring of SMEM stages with bulk copies on mbarriers, consumer warps drain it (codegen.pipeline)",
    "B": "consumer with typed SMEM regions declared in the spec",
    "C": "consumer with one monolithic SMEM region and hand-rolled offsets",
    "D": "consumer only, no SMEM (elementwise)",
    "E": "a small __device__ helper fused inside a host kernel",
}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that would collide with C/C++ keywords in generated code (namespaces, functions).
_CPP_KEYWORDS = {
    "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch", "char",
    "class", "const", "constexpr", "continue", "default", "delete", "do", "double", "else",
    "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
    "inline", "int", "long", "namespace", "new", "not", "nullptr", "operator", "or", "private",
    "protected", "public", "register", "return", "short", "signed", "sizeof", "static",
    "struct", "switch", "template", "this", "throw", "true", "try", "typedef", "typename",
    "union", "unsigned", "using", "virtual", "void", "volatile", "while",
}


class ScaffoldError(Exception):
    """A kernel that cannot be scaffolded: bad name, unknown family, or it already exists."""


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(SCAFFOLD_DIR)),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
        variable_start_string="[[", variable_end_string="]]",
        block_start_string="<%", block_end_string="%>",
        comment_start_string="<#", comment_end_string="#>")


def check_name(root: Path, name: str) -> None:
    """Raise ScaffoldError unless `name` is a usable, unused kernel name under root."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ScaffoldError(f"kernel name {name!r} is not a C identifier "
                            "(letters, digits and _, not starting with a digit); try e.g. 'gelu_v2'")
    if name in _CPP_KEYWORDS or keyword.iskeyword(name):
        raise ScaffoldError(f"kernel name {name!r} is a C++ or Python keyword; pick another name")
    if name.startswith("__") or "__" in name:
        raise ScaffoldError(f"kernel name {name!r} contains '__' (reserved in C++, and the harness "
                            "uses '<kernel>__<variant>' for its entry points); pick another name")
    spec = root / config.SPEC_DIRNAME / f"{name}.yaml"
    kdir = root / config.KERNEL_DIRNAME / name
    for path in (spec, kdir):
        if path.exists():
            raise ScaffoldError(f"kernel {name!r} already exists: {path.relative_to(root)} is there; "
                                "pick another name or edit the existing kernel")


def normalize_family(family: str) -> str:
    fam = family.strip().upper() if isinstance(family, str) else family
    if fam not in FAMILIES:
        known = "; ".join(f"{k} = {v}" for k, v in FAMILIES.items())
        raise ScaffoldError(f"unknown family {family!r}: use one of A-E ({known})")
    return fam


def render(name: str, family: str) -> dict[str, str]:
    """The three files as text, keyed by their path relative to the project root."""
    fam = normalize_family(family)
    env = _environment()
    ctx = {"name": name, "family": fam, "family_doc": FAMILIES[fam]}
    try:
        return {
            f"{config.SPEC_DIRNAME}/{name}.yaml": env.get_template("spec.yaml.j2").render(**ctx),
            f"{config.KERNEL_DIRNAME}/{name}/{name}.cuh.j2":
                env.get_template(f"body_{fam}.cuh.j2").render(**ctx),
            f"{config.KERNEL_DIRNAME}/{name}/reference.py":
                env.get_template("reference.py.j2").render(**ctx),
        }
    except jinja2.TemplateError as exc:  # a broken scaffold template is our bug: say which
        raise ScaffoldError(f"scaffold template for family {fam} does not render: {exc}") from exc


def create(root: Path, name: str, family: str) -> list[Path]:
    """Write the new kernel's spec, body template and reference; return the paths written.

    Raises ScaffoldError (and writes nothing) for a non-identifier or taken name or an
    unknown family."""
    root = Path(root)
    check_name(root, name)
    files = render(name, family)
    written: list[Path] = []
    kdir = root / config.KERNEL_DIRNAME / name
    try:
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "x") as fh:          # "x": never overwrite
                fh.write(text)
            written.append(path)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        if kdir.is_dir() and not any(kdir.iterdir()):
            kdir.rmdir()
        raise ScaffoldError(f"cannot write kernel {name!r}: {exc}") from exc
    return written


def main(argv=None) -> int:
    """`python -m mpkbuild.scaffold NAME FAMILY [ROOT]`: the same as `scons new=NAME family=F`."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        sys.stderr.write("usage: python -m mpkbuild.scaffold NAME FAMILY(A-E) [PROJECT_ROOT]\n")
        return 2
    root = Path(args[2]) if len(args) == 3 else Path.cwd()
    from mpkbuild.model.project import ProjectError, use_project
    try:
        use_project(root)                  # its mpkbuild.yaml: where specs/ and kernels/ are
        paths = create(root, args[0], args[1])
    except (ScaffoldError, ProjectError) as exc:
        sys.stderr.write(f"mpk: error: {exc}\n")
        return 1
    for path in paths:
        print(f"new       {path.relative_to(root)}")
    print(f"next: scons kernel={args[0]} stage=compile")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
