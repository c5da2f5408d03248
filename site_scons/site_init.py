"""Read by SCons before the SConstruct (and before it prints "scons: Reading SConscript
files ..."): `--json` asks for JSON alone on stdout, so SCons's progress lines are turned
off here, as -Q would (the tool's --json option is only declared later, by the SConstruct)."""
import os as _os
import shlex as _shlex
import sys as _sys


def _mpk_wants_json() -> bool:
    words = _sys.argv[1:] + _shlex.split(_os.environ.get("SCONSFLAGS", ""))
    return "--json" in words


if _mpk_wants_json():
    import SCons.Script.Main as _main
    _main.progress_display.set_mode(0)
