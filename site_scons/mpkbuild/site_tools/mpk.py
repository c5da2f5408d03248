"""SCons tool `mpk`: hands SCons the graph that mpkbuild plans, one Command per node.

A project loads it from the installed package: Environment(tools=["mpk"],
toolpath=[mpkbuild.toolpath()]) (docs/plugin.md).

mpkbuild.cli reads the command line and plans the graph (mpkbuild.model.graph, from the
stage table in mpkbuild.stages); each node's action is its stage module's. SCons decides
what runs (by content); the executor only decides where a GPU gate runs.
"""
from __future__ import annotations

import gc
import signal

import SCons.Action
import SCons.Script

from mpkbuild import cli, stages
from mpkbuild.util.closure import ACTION_VERSION


_INTERRUPT_STATE: list = []       # SCons's flag, once found (it outlives its handler)


def _interrupted() -> bool:
    """Whether SCons caught SIGINT/SIGTERM: SCons lets running actions finish, but a GPU gate
    can run for minutes, so the executor polls this and stops the gate's process group.
    SCons keeps the flag on the Jobs object bound as a default of its signal handler; it is
    held once found, because SCons puts the old handler back before the verdict table is
    printed at exit, and the table must say the build was interrupted."""
    if not _INTERRUPT_STATE:
        handler = signal.getsignal(signal.SIGINT)
        try:
            _INTERRUPT_STATE.append(handler.__defaults__[0].job.interrupted)
        except (AttributeError, IndexError, TypeError):
            return False
    return bool(_INTERRUPT_STATE[0]())


def _wants_json() -> bool:
    import os
    import shlex
    import sys
    return "--json" in sys.argv[1:] + shlex.split(os.environ.get("SCONSFLAGS", ""))


_BUILD: list[cli.Build] = []      # this invocation's build (one per scons process)


def _run_node(target, source, env):
    """Every node's action: its stage module's function for its kind. A node's parameters
    are looked up by its first target, not kept in construction variables (no override
    environment per Command)."""
    build = _BUILD[0]
    _interrupted()                 # holds SCons's flag while its handler is installed
    info = build.info[str(target[0])]
    return stages.actions()[info["MPK_KIND"]](build, info, target, source)


class _NodeAction(SCons.Action.FunctionAction):
    """The action of every node, with the signature we declare: ACTION_VERSION. SCons
    signs a Python function action by its compiled code, so a no-op edit of the dispatch
    above, another Python or an SCons upgrade would re-run every node while status and -n
    (which cannot see that) said fresh. What makes an output is declared instead: each
    node's `code:` fact (its stage's import closure, normalised) and this version, which
    status checks as SCons does (status.ACTION_SIGNATURE)."""

    def get_presig(self, target, source, env, executor=None):
        return ACTION_VERSION.encode()


_ACTION = _NodeAction(_run_node, {"strfunction": lambda t, s, e: _BUILD[0].info[str(t[0])]["MPK_LABEL"]})


def declare(env) -> list:
    """Declare everything the command line asks for; returns the default targets.

    The cyclic garbage collector is off while the graph is planned and declared (status, -n,
    check, dag and why= answer and exit in there): that allocates many objects and frees
    almost none, so each collection only re-scans a heap that keeps growing. Then the
    declared graph is frozen (never scanned again) and collection resumes for what the
    build itself allocates: ~17% of a no-op build's CPU time at 200 kernels."""
    gc.disable()
    try:
        return _declare(env)
    finally:
        gc.freeze()
        gc.enable()


def _declare(env) -> list:
    build, g, targets, requested = cli.plan(env, should_stop=_interrupted)
    if g is None:                          # -h
        return []
    _BUILD.append(build)
    for node in g.nodes:
        if node.waits:                     # a gate this GPU profile cannot run: status shows it
            continue
        sources = [env.File(s) for s in node.sources] + [env.Value(f) for f in node.facts]
        declared = env.Command(list(node.targets), sources, _ACTION)
        build.info[str(declared[0])] = {"MPK_KIND": node.kind, "MPK_KERNEL": node.kernel or "",
                                        "MPK_GPU_KEY": g.gpu_key,
                                        **dict(node.opts),
                                        "MPK_LABEL": None if node.silent else node.label}
        for side in node.side_effects:
            env.SideEffect(side, declared)
        if node.always:
            env.AlwaysBuild(declared)
        if node.precious:
            env.Precious(declared)
        if node.kernel is None and SCons.Script.ARGUMENTS.get("kernel", "all") != "all":
            env.NoClean(declared)          # shared per-GPU nodes: only kernel=all cleans them
        if node.committed:                 # tuned/<gpu>/K.json: -c keeps it
            env.NoClean(declared)
    for k in build.kernels.values():
        # what no node declares (the spec cache, the digests gate results keep beside them),
        # file by file: cleaning the whole folder first made SCons then fail to remove the
        # targets inside it ("Could not remove ..._spec.h")
        extra = [p for p in k.build_dir.rglob(".*") if p.is_file()
                 and (p.name == ".spec-cache.json" or p.name.endswith(".written"))]
        if extra:
            env.Clean(env.File(str(k.spec_json)), [str(p) for p in extra])
    cli.report_at_exit(env, requested, _interrupted)
    # one alias as the default target: a no-op prints one line, not one per file
    return env.Alias("mpk", [env.File(t) for t in targets])


def generate(env):
    # No timestamp is trusted: by default SCons reuses a file's recorded signature when its
    # mtime is unchanged and more than two days old (max_drift), so a same-size edit with
    # its mtime put back (cp -p, rsync -t, a restored cache) would go unseen. A negative
    # max_drift makes SCons hash every file on every run (0 would mean "always trust").
    # Every node is judged by content and its inputs are declared, never scanned from a cache.
    SCons.Script.SetOption("max_drift", -1)
    SCons.Script.SetOption("implicit_cache", 0)
    env.Decider("content")
    if _wants_json():
        # JSON alone on stdout from here on; the line SCons prints before it reads the
        # SConstruct can only be kept off by -Q (or a project's site_scons/site_init.py)
        from SCons.Script import Main as scons_main
        scons_main.progress_display.set_mode(0)
    SCons.Script.AddOption("--json", dest="mpk_json", action="store_true", default=False,
                           help="scons status: print JSON")
    SCons.Script.AddOption("--details", dest="mpk_details", action="store_true", default=False,
                           help="scons status: the reasons of pending and never-run nodes too")
    env.AddMethod(declare, "MpkDeclare")


def exists(env):
    return True
