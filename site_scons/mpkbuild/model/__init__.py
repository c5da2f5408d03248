"""The model: kernels, their specs and paths, and the build graph as plain data (stages.build_graph fills it from the stage table)."""
