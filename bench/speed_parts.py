"""What each speed-only mechanism buys, on a built synthetic tree of N kernels.

    python bench/speed_parts.py TREE [--runs 5]

TREE: a tree bench/status_bench.py built (`--work DIR` keeps it: DIR/n200/tree), or any
built project; its own site_scons is the code measured. Each mechanism is timed with and without, in this process, median of --runs:

- spec cache: every kernel's Kernel.load with build/K/.spec-cache.json vs a full load
  (YAML parse, schema check, semantic checks);
- code digests: the graph's code facts with build/.code-digests.json vs without it;
- .sconsign reader: every record of .sconsign.dblite through sconsign.py's plain records vs
  SCons's own classes;
- one read per file: planning and status with one ReadOnce vs one per reader;
- gc off while planning: stages.build_graph with the cyclic collector on vs off.
"""
from __future__ import annotations

import argparse
import gc
import io
import pickle
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "fakes"))


def timed(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    root = Path(args.tree).resolve()
    # the tree's own copy of the code (the one its build recorded), else this checkout's
    sys.path.insert(0, str(root / "site_scons" if (root / "site_scons").is_dir() else REPO / "site_scons"))
    from fake_gpu import FakeGpuExecutor
    from mpkbuild import sconsign, stages, status
    from mpkbuild.model.graph import CODE_CACHE
    from mpkbuild.model.kernel import discover
    from mpkbuild.stages.wire import WireRequest
    from mpkbuild.util import closure, config
    from mpkbuild.util.fsutil import ReadOnce

    names = discover(root)
    fp = FakeGpuExecutor().fingerprint()
    rows = []

    cached = timed(lambda: [stages.load_kernel(root, n, write_cache=False) for n in names], args.runs)
    full = timed(lambda: [stages.load_spec(root / config.SPEC_DIRNAME / f"{n}.yaml", root) for n in names], args.runs)
    rows.append(("spec cache", full, cached))

    kernels = [stages.load_kernel(root, n, write_cache=False) for n in names]
    cache_file = root / config.BUILD_DIRNAME / CODE_CACHE

    def code_facts(use_cache: bool):
        closure.module_files.cache_clear()
        digests = closure.CodeDigests(cache_file if use_cache else None)
        for s in stages.STAGES:
            digests.digest(s.code_modules())
    rows.append(("code digests", timed(lambda: code_facts(False), args.runs),
                 timed(lambda: code_facts(True), args.runs)))

    import SCons.dblite
    db = SCons.dblite.open(str(root / ".sconsign"), "r")
    keys = list(db.keys())

    def read_sconsign(unpickler):
        for key in keys:
            unpickler(io.BytesIO(db[key])).load()
    import SCons.SConsign  # noqa: F401  (its classes, for pickle)
    import SCons.Node.FS  # noqa: F401
    import SCons.Node.Python  # noqa: F401
    import SCons.Node.Alias  # noqa: F401
    rows.append((".sconsign reader", timed(lambda: read_sconsign(pickle.Unpickler), args.runs),
                 timed(lambda: read_sconsign(sconsign._unpickler()), args.runs)))

    class EveryRead(ReadOnce):
        """A ReadOnce that forgets: every reader reads (and parses, and hashes) again."""
        def bytes(self, rel):
            self._bytes.clear()
            return super().bytes(rel)

        def json(self, rel):
            self._bytes.clear()
            self._json.clear()
            return super().json(rel)

        def signature(self, rel):
            self._bytes.clear()
            self._sigs.clear()
            return super().signature(rel)

    def plan_and_judge(files_cls):
        files = files_cls(root)
        sc = sconsign.Sconsign(root)
        g = stages.build_graph(root, kernels, fp, WireRequest(None, False, False), True,
                               tampered=lambda rel: sconsign.tampered(files, sc, rel), files=files)
        status.compute(g, sc, status.Predictor(root, {k.name: k for k in kernels}, None, root / "wiring"),
                       True, files=files)
    rows.append(("one read per file", timed(lambda: plan_and_judge(EveryRead), args.runs),
                 timed(lambda: plan_and_judge(ReadOnce), args.runs)))

    def build_graph(collect: bool):
        (gc.enable if collect else gc.disable)()
        try:
            stages.build_graph(root, kernels, fp, WireRequest(None, False, False), True)
        finally:
            gc.enable()
    rows.append(("gc off while planning", timed(lambda: build_graph(True), args.runs),
                 timed(lambda: build_graph(False), args.runs)))

    print(f"N={len(names)} kernels, {root}")
    print(f"{'mechanism':<24} {'without s':>10} {'with s':>8} {'saves s':>8}")
    for name, without, with_ in rows:
        print(f"{name:<24} {without:>10.3f} {with_:>8.3f} {without - with_:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
