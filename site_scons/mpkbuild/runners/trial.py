"""The tune stage's trial, GPU side: one candidate validated, then timed if it passed.

The candidate's library holds one variant (its configuration). Validation is the validate
gate's (runners/validate.py), timing the perf gate's (runners/perf.py: CUDA-graph replays
paired with the torch baseline's), of the one figure the tune compares on (the job's
`figure`, the spec's `tune.figure`) against the primary baseline alone: no other baseline,
figure or slowCTA, which the pick never reads. A candidate that fails validation is
`rejected` and never timed; the build picks among the `timed` ones (stages/tune/).
"""
from __future__ import annotations

import time

from . import perf, validate
from .common import run_main


def main(job: dict) -> dict:
    started = time.perf_counter()
    checked = validate.main(job)
    if checked["verdict"] != "pass":
        return {"verdict": "rejected", "check": "validate", "device": checked.get("device", {}),
                "message": f"validate: {checked.get('message', checked['verdict'])}",
                "validate": checked}
    timed = perf.main(job, only_figure=job["figure"])
    return {"verdict": "timed", "device": timed.get("device", {}),
            "message": "validated and timed", "validate": {"verdict": "pass",
                                                          "variants": checked["variants"]},
            "perf": timed, "elapsed_in_runner_s": round(time.perf_counter() - started, 3)}


if __name__ == "__main__":
    run_main(main)
