"""GPU-side gate runners: each is run as `python -m mpkbuild.runners.<gate> JOB.json` in a
fresh process (crash isolation), reads the job, writes one result JSON, and exits.

Importing the package starts the lifeline: a runner whose build died (even by SIGKILL)
kills its own process group instead of holding a GPU until its timeout.
"""
from . import lifeline as _lifeline

_lifeline.start_from_env()
