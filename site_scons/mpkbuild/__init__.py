"""mpkbuild: the library behind the kernel build graph.

Everything here is plain Python that tests import without SCons: spec loading and
validation, code generation, nvcc invocation and resource gating, the GPU gate runners and
their executor, and review rendering. The SCons tool (mpkbuild/site_tools/mpk.py) only
declares the nodes the stage table in :mod:`mpkbuild.stages` plans and calls into here.

A project loads the tool as any SCons tool from a folder::

    import mpkbuild
    env = Environment(tools=["mpk"], toolpath=[mpkbuild.toolpath()])
    Default(env.MpkDeclare())
"""
from pathlib import Path as _Path

__version__ = "0.1.0"


def toolpath() -> str:
    """The folder holding the SCons tool `mpk` (for Environment(toolpath=[...]))."""
    return str(_Path(__file__).resolve().parent / "site_tools")
