"""GPU-side gate runners: each is run as `python -m mpkbuild.runners.<gate> JOB.json` in a
fresh process (crash isolation), reads the job, writes one result JSON, and exits."""
