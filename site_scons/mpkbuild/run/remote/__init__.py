"""Gates on another machine: the job bundle, its bootstrap, ssh and dask."""
