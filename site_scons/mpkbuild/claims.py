"""Variant claims: how the runners of one perf gate on several GPUs split its variants.

Both sides live here: the local executor makes the folder, counts the claims and says STOP
when a runner hung or crashed; each runner takes a variant by creating `<variant>.claim`
first (O_EXCL: exactly one runner gets it, across processes). Standard library only.
"""
from __future__ import annotations

import os
from pathlib import Path

STOP = "STOP"


def claim(folder: str | None, variant: str) -> bool:
    """Without a folder (a gate not shared) every variant is this runner's; with one, a
    variant is this runner's if it made the claim file first, and none is once STOP is there."""
    if folder is None:
        return True
    if os.path.exists(os.path.join(folder, STOP)):
        return False
    try:
        os.close(os.open(os.path.join(folder, f"{variant}.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def claimed_names(folder: Path) -> set[str]:
    return {p.name[:-len(".claim")] for p in folder.glob("*.claim")}


def stop(folder: Path) -> None:
    (folder / STOP).touch()


def stopped(folder: Path) -> bool:
    return (folder / STOP).exists()
