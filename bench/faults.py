"""The fault-injection suite on the GPU box: every fixture's verdict against the expectation.

    python bench/faults.py --out DIR [--only hang,oob,...] [--no-sanitize] [--work DIR]

Copies the project with the fixtures of tests/fixtures/faults (and rmsnorm_v2 for sm_90a)
to a work folder, runs each case of faultsuite.CASES through real scons on this machine's
GPU (a compile, a plain validate, or `validate sanitize=TOOL`), and after each hang or
crash runs rmsnorm_v2's validate again on the same GPU ("gate after", which must pass).
Prints one table row per run: case, fixture, expected and actual verdict, the message's
first line, seconds. Every scons output, result JSON, gate log and sanitizer report goes
to --out. Exits 1 if any row differs from its expectation.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "faults"))
sys.path.insert(0, str(REPO / "site_scons"))
import faultsuite  # noqa: E402
from mpkbuild.run import sanitizer  # noqa: E402


def keep_evidence(out: Path, label: str, root: Path, outcome) -> None:
    """scons's output, and the kernel's gate files (result, log, sanitizer report, compile log)."""
    dest = out / label
    dest.mkdir(parents=True, exist_ok=True)
    if outcome.run is not None:
        (dest / "scons.txt").write_text(outcome.run.output)
    kdir = root / "build" / outcome.case.kernel
    for pattern in ("gpu/*/validate.*", "sm_90a/compile.log", "sm_90a/resources.json"):
        for path in kdir.glob(pattern):
            shutil.copy2(path, dest / path.name)
    (dest / "judged.json").write_text(json.dumps(
        {"case": outcome.case.name, "kernel": outcome.case.kernel, "expected": outcome.case.verdict,
         "verdict": outcome.verdict, "ok": outcome.ok, "problems": outcome.problems,
         "message": outcome.message, "seconds": outcome.seconds}, indent=2) + "\n")


def row(label: str, outcome) -> tuple:
    mark = "ok" if outcome.ok else "MISMATCH"
    first = outcome.first_line.replace("\n", " ")
    return (label, outcome.case.kernel, outcome.case.verdict, outcome.verdict, mark,
            f"{outcome.seconds:.1f}", first[:110])


def print_table(rows: list[tuple]) -> None:
    head = ("case", "fixture", "expected", "got", "", "s", "first message line")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(6)]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:6], widths)) + "  " + r[6])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for logs and results")
    ap.add_argument("--work", type=Path, default=None, help="project copy (default: a temp folder)")
    ap.add_argument("--only", default="", help="comma list of case names (default: all)")
    ap.add_argument("--no-sanitize", action="store_true", help="skip the sanitize= cases")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per scons run")
    args = ap.parse_args()

    wanted = {n for n in args.only.split(",") if n}
    unknown = wanted - {c.name for c in faultsuite.CASES}
    if unknown:
        ap.error(f"--only: no case named {', '.join(sorted(unknown))}")
    cases = [c for c in faultsuite.CASES if not wanted or c.name in wanted]
    notes = []
    if not args.no_sanitize:
        try:
            notes.append(f"compute-sanitizer: {sanitizer.find()}")
        except sanitizer.SanitizerMissing as exc:
            notes.append(f"sanitize= cases skipped: {exc}")
            args.no_sanitize = True
    if args.no_sanitize:
        cases = [c for c in cases if not c.sanitize]

    work = args.work or Path(tempfile.mkdtemp(prefix="mpk-faults-"))
    root = faultsuite.make_project(work / "proj")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"project copy: {root}")
    for note in notes:
        print(note)

    rows, bad = [], 0
    for case in cases:
        label = case.name + (f" ({case.sanitize})" if case.sanitize else "")
        outcome = faultsuite.run_case(root, case, timeout=args.timeout)
        keep_evidence(args.out, case.name, root, outcome)
        rows.append(row(label, outcome))
        bad += not outcome.ok
        print(f"{'ok ' if outcome.ok else 'BAD'} {label}: {outcome.verdict} ({outcome.seconds:.1f} s)"
              + ("" if outcome.ok else f"  <- {'; '.join(outcome.problems)}"), flush=True)
        if case.gate_after:
            after = faultsuite.run_gate_after(root, timeout=args.timeout)
            keep_evidence(args.out, f"{case.name}.gate_after", root, after)
            rows.append(row(f"  gate after {case.name}", after))
            bad += not after.ok
            print(f"{'ok ' if after.ok else 'BAD'}   gate after {case.name}: {after.verdict} "
                  f"({after.seconds:.1f} s)" + ("" if after.ok else f"  <- {'; '.join(after.problems)}"),
                  flush=True)

    print()
    print_table(rows)
    print(f"\n{len(rows) - bad}/{len(rows)} as expected; evidence in {args.out}")
    (args.out / "table.txt").write_text("\n".join("\t".join(map(str, r)) for r in rows) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
