"""The perf ledger: each GPU profile's accepted perf results per kernel, committed like
gpu_profiles/ (perf_history/<gpu key>/<kernel>.json).

A result is accepted explicitly, after a perf gate passed and its numbers were looked at:

    python -m mpkbuild.stages.perf.ledger accept KERNEL [--gpu KEY] [--note TEXT]
    python -m mpkbuild.stages.perf.ledger show KERNEL [--gpu KEY]

The perf gate compares with the last accepted entry for its GPU (stages/perf/judge.
history_delta) and fails a regression that both the cold time and its ratio to the
baseline confirm; `scons status` shows the delta of the last perf result. The last entry's hash is a fact of the perf node: accepting
a result re-judges (and so re-times) the gate once, against what was accepted.
Standard library only.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from mpkbuild.util import config
from mpkbuild.util.fsutil import read_json, write_json_atomic

KEEP = 50          # entries kept per ledger (the oldest dropped)


def ledger_rel(gpu_key: str, kernel: str) -> str:
    return f"{config.HISTORY_DIRNAME}/{gpu_key}/{kernel}.json"


def ledger_path(root: Path, gpu_key: str, kernel: str) -> Path:
    return Path(root) / ledger_rel(gpu_key, kernel)


def load(root: Path, gpu_key: str | None, kernel: str, files=None) -> dict | None:
    """The ledger; files: a planning run's ReadOnce to read it through (each file once)."""
    if not gpu_key:
        return None
    data = (files.json(ledger_rel(gpu_key, kernel)) if files is not None
            else read_json(ledger_path(root, gpu_key, kernel)))
    return data if data is not None and isinstance(data.get("entries"), list) else None


def last_entry(root: Path, gpu_key: str | None, kernel: str, files=None) -> dict | None:
    data = load(root, gpu_key, kernel, files)
    return data["entries"][-1] if data and data["entries"] else None


def fact(root: Path, gpu_key: str | None, kernel: str, files=None) -> str:
    """The perf node's history fact: the hash of the entry it is judged against."""
    entry = last_entry(root, gpu_key, kernel, files)
    if entry is None:
        return "history: none"
    return "history: " + hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:16]


def _interval(fig: dict) -> dict:
    from mpkbuild.stages.perf.judge import time_interval
    med, lo, hi = time_interval(fig)
    return {"median_us": med, "lo": lo, "hi": hi, "n": len(fig.get("samples_us") or [])}


def _vs_baseline(r: dict) -> dict:
    """The kernel / primary baseline paired ratio per figure, with its interval: the later
    check compares ratios as well as times (stages/perf/judge.history_delta)."""
    from mpkbuild.stages.perf.judge import FIGURES, comparison
    from mpkbuild.util.perfspec import PRIMARY
    out = {}
    for fig in FIGURES:
        c = comparison(r, PRIMARY, fig)
        if c is not None and not c.get("point") and c.get("ratio") is not None:
            out[fig] = {"ratio": c["ratio"], "lo": c["lo"], "hi": c["hi"], "n": c["n"]}
    return out


def entry_from_result(result: dict, note: str | None = None, commit: str | None = None) -> dict:
    """What the ledger keeps of one perf result: per variant and figure, the median time
    and its interval, the paired ratio to the primary baseline with its interval, and each
    baseline's median (enough to judge the next result)."""
    variants = {}
    for name, r in (result.get("variants") or {}).items():
        v = {fig: _interval(r[fig]) for fig in ("hot", "cold") if fig in r}
        v["vs_baseline"] = _vs_baseline(r)
        v["baselines"] = {b: {fig: f[fig]["median_us"] for fig in ("hot", "cold") if fig in f}
                          for b, f in (r.get("baselines") or {}).items()}
        variants[name] = v
    return {"accepted": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit, "note": note, "result_finished": result.get("finished"),
            "gpu_state": (result.get("gpu_state") or {}).get("start"), "variants": variants}


def accept(root: Path, kernel: str, gpu_key: str, result: dict, note: str | None = None,
           force: bool = False) -> Path:
    if result.get("verdict") != "pass" and not force:
        raise ValueError(f"{kernel} on {gpu_key}: the perf result's verdict is "
                         f"{result.get('verdict')!r}, not pass (--force accepts it anyway)")
    path = ledger_path(root, gpu_key, kernel)
    data = load(root, gpu_key, kernel) or {"kernel": kernel, "gpu_key": gpu_key, "entries": []}
    data["entries"] = (data["entries"] + [entry_from_result(result, note, _commit(root))])[-KEEP:]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)
    return path


def _commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _gpu_keys(root: Path, kernel: str) -> list[str]:
    return sorted(p.parent.name for p in (Path(root) / config.BUILD_DIRNAME / kernel / "gpu").glob("*/perf.json"))


def main(argv=None) -> int:
    import argparse              # the command line only: every build and status imports this module
    ap = argparse.ArgumentParser(prog="python -m mpkbuild.stages.perf.ledger", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("accept", "show"))
    ap.add_argument("kernel")
    ap.add_argument("--gpu", help="GPU profile key (default: the only one with a perf result)")
    ap.add_argument("--note")
    ap.add_argument("--force", action="store_true", help="accept a result that did not pass")
    ap.add_argument("--root", type=Path, default=Path.cwd())
    args = ap.parse_args(argv)
    from mpkbuild.model.project import ProjectError, use_project
    try:
        use_project(args.root)          # its mpkbuild.yaml: where build/ and perf_history/ are
    except ProjectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keys = [args.gpu] if args.gpu else _gpu_keys(args.root, args.kernel)
    if len(keys) != 1:
        print(f"name the GPU profile with --gpu: {', '.join(keys) or 'no perf result'}", file=sys.stderr)
        return 2
    key = keys[0]
    if args.action == "show":
        print(json.dumps(load(args.root, key, args.kernel) or {}, indent=2))
        return 0
    perf = Path(args.root) / config.BUILD_DIRNAME / args.kernel / "gpu" / key / "perf.json"
    try:
        result = json.loads(perf.read_text())
        path = accept(args.root, args.kernel, key, result, args.note, args.force)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"accepted {perf} into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
