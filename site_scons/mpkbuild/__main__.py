"""`mpkbuild init [DIR]`: start a kernel project that uses the installed plugin.

It writes the SConstruct that loads the `mpk` tool from the package, mpkbuild.yaml (the
project's folders; the checkout it sits in, when it sits in one, as its default mpk_root),
a .gitignore, a first kernel from the scaffold and a .ci/run example; nothing is copied
from the package. Everything is rendered first and written with "x" (never over a file),
so a refusal changes nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jinja2

from mpkbuild.util import config

PROJECT_TEMPLATES = config.TEMPLATE_DIR / "project"
# what init writes, by template (the first kernel's files come from the scaffold)
FILES = {"SConstruct": "SConstruct.j2", config.PROJECT_FILE: "mpkbuild.yaml.j2",
         ".gitignore": "gitignore.j2", ".ci/run": "ci_run.sh.j2"}


class InitError(Exception):
    """A project that cannot be started here: names what is in the way."""


def enclosing_checkout(folder: Path) -> Path | None:
    """The Mirage checkout folder sits in (itself or a parent with the checkout's layout)."""
    from mpkbuild.wire.surface import load_surface
    layout = load_surface(config.SHIPPED_WIRING).layout
    for candidate in (folder, *folder.parents):
        if all((candidate / rel).is_file() for rel in layout):
            return candidate
    return None


def render(folder: Path, kernel: str, family: str) -> dict[str, str]:
    """Every file of the new project as text, by path relative to it."""
    from mpkbuild import scaffold
    checkout = enclosing_checkout(folder.resolve())
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(PROJECT_TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    ctx = {"layout": config.DEFAULT_LAYOUT, "kernel": kernel, "family": family,
           "mpk_root": os.path.relpath(checkout, folder.resolve()) if checkout else None,
           "profiles": sorted(p.stem for p in config.SHIPPED_PROFILES.glob("*.json"))}
    files = {rel: env.get_template(name).render(**ctx) for rel, name in FILES.items()}
    files.update(scaffold.render(kernel, family))
    return files


def init(folder: Path, kernel: str = "scale_v1", family: str = "D") -> list[Path]:
    """Write a new project into folder (made if missing); refuses, writing nothing, where
    a project already is or any file would be overwritten."""
    from mpkbuild import scaffold
    folder = Path(folder)
    config.use_layout({})                    # a new project has the default layout
    try:
        scaffold.check_name(folder, kernel)
        files = render(folder, kernel, scaffold.normalize_family(family))
    except scaffold.ScaffoldError as exc:
        raise InitError(str(exc)) from None
    in_the_way = [rel for rel in files if (folder / rel).exists()]
    if in_the_way:
        raise InitError(f"{folder}: {', '.join(in_the_way)} already there; init starts a new "
                        "project and overwrites nothing (use `scons new=NAME` to add a kernel)")
    written: list[Path] = []
    try:
        for rel, text in files.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "x") as fh:
                fh.write(text)
            written.append(path)
        (folder / ".ci" / "run").chmod(0o755)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise InitError(f"cannot write {folder}: {exc}") from None
    return written


def main(argv=None) -> int:
    from mpkbuild.scaffold import FAMILIES
    ap = argparse.ArgumentParser(prog="mpkbuild", description="The kernel build graph's command "
                                 "line outside SCons (everything else is `scons ...` in a project).")
    sub = ap.add_subparsers(dest="command", required=True)
    p_init = sub.add_parser("init", help="start a kernel project in DIR (default: here)")
    p_init.add_argument("dir", nargs="?", default=".")
    p_init.add_argument("--kernel", default="scale_v1", help="the first kernel's name (scale_v1)")
    p_init.add_argument("--family", default="D", choices=sorted(FAMILIES),
                        help="its scaffold family (D: elementwise; `scons -h` in the project)")
    sub.add_parser("toolpath", help="print the folder of the SCons tool `mpk`")
    p_schema = sub.add_parser("schema", help="print the path of the spec JSON schema (for editors)")
    p_schema.add_argument("--json", action="store_true",
                          help="print the schema itself, composed from the stages' sections")
    args = ap.parse_args(argv)
    if args.command == "toolpath":
        from mpkbuild import toolpath
        print(toolpath())
        return 0
    if args.command == "schema":
        if args.json:
            import json
            from mpkbuild import stages
            json.dump(stages.spec_loader().schema, sys.stdout, indent=2, sort_keys=True)
            sys.stdout.write("\n")
        else:
            print(config.SPEC_SCHEMA_FILE)
        return 0
    folder = Path(args.dir)
    try:
        written = init(folder, args.kernel, args.family)
    except InitError as exc:
        sys.stderr.write(f"mpkbuild: error: {exc}\n")
        return 2
    print("created " + ", ".join(os.path.relpath(p, folder) for p in written))
    print(f"next: cd {folder} && scons      (compiles {args.kernel}; `scons -h` lists the rest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
