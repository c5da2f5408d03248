"""mpkbuild: the library behind the kernel build graph.

Everything here is plain Python that tests import without SCons: spec loading and
validation, code generation, nvcc invocation and resource gating, the GPU gate runners and
their executor, and review rendering. The SCons tool (site_scons/site_tools/mpk.py) only
declares the nodes the stage table in :mod:`mpkbuild.stages` plans and calls into here.
"""
