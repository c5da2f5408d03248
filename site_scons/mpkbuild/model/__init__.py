"""The model: kernels, their specs and the graph built from the stage table."""
