"""`python -m mpkbuild.runners.launch MODULE JOB.json`: run a runner module as __main__ with
the lifeline already started (importing this package starts it), whatever package the
runner comes from (ours, or a test's stand-in)."""
import runpy
import sys

if __name__ == "__main__":
    module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
