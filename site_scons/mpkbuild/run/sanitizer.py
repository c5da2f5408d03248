"""`sanitize=TOOL`: the validate gate under NVIDIA compute-sanitizer, and its report as a verdict.

This module is a tool wrapper (run.job.ToolWrapper) and owns three things: finding the
compute-sanitizer binary (:func:`find`), the command that runs a gate runner under it with
the report going to its own file (:func:`wrap`), and reading that report back into a gate
result (:func:`verdict`, :func:`finish`). It never runs anything itself; the executor runs
the wrapped command like any other gate.

The report is compute-sanitizer's text format: every line it writes starts with
``=========``; a finding starts with an unindented line ("Invalid __global__ write of size
4 bytes", "Barrier error detected. ...", "Error: Race reported between ...") followed by
indented detail lines ("at kernel+0x70 in file.cu:12", "by thread (1,0,0) in block
(0,0,0)", "Address 0x... is out of bounds"); the run ends with ``ERROR SUMMARY: N errors``
or, for racecheck, ``RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)``.
A report without its summary means the tool did not finish: that is never a pass.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mpkbuild.run.job import ToolMissing
from mpkbuild.util.toolchain import toolkit_copies

TOOLS = ("memcheck", "racecheck", "synccheck")

ENV_VAR = "MPK_COMPUTE_SANITIZER"
WHEEL = "nvidia-cuda-sanitizer-api"
# compute-sanitizer returns this when the application exited 0 and the tool found errors;
# any other non-zero code is the application's own, or the tool failing.
ERROR_EXITCODE = 86
# compute-sanitizer slows a gate down by an order of magnitude: its watchdog waits longer
TIMEOUT_FACTOR = 10.0
PRINT_LIMIT = 20                # findings printed in full; the summary still counts them all
# The frontend waits this long for the runner to connect (at its first CUDA call, after the
# torch import); the tool's own default of 10 s is too tight for a cold torch import.
LAUNCH_TIMEOUT_S = 120
# Bytes of guard after every allocation, so a store just past one tensor is not silently
# inside the next one (memcheck only knows allocation bounds).
PADDING_BYTES = 256
# torch's caching allocator sub-allocates tensors from large cudaMalloc segments, where a
# store past one tensor is still inside the segment and memcheck sees nothing: under
# memcheck every tensor gets its own cudaMalloc.
MEMCHECK_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

PREFIX = "========="

MISSING_HELP = (
    "compute-sanitizer was not found. Install it with `pip install -e .[sanitize]` (the "
    f"{WHEEL} wheel, 13.4 or later), put the CUDA toolkit's "
    f"bin/ on PATH, or set {ENV_VAR}=/path/to/compute-sanitizer.")


class SanitizerMissing(ToolMissing):
    """No usable compute-sanitizer binary; the message says how to get one."""


# ---------------------------------------------------------------- finding the binary
def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_candidates() -> list[Path]:
    """Where the pip wheel puts the binary: nvidia/cu13/compute-sanitizer/ (13.4 on: the
    toolkit's layout, helpers beside the binary), nvidia/cu13/bin/ (13.0-13.3), and the
    12.x wheels' nvidia/cuda_sanitizer_api/compute-sanitizer/."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    out = []
    for loc in spec.submodule_search_locations or []:
        base = Path(loc)
        out += sorted(base.glob("cu*/compute-sanitizer/compute-sanitizer"), reverse=True)
        out += sorted(base.glob("cu*/bin/compute-sanitizer"), reverse=True)
        out.append(base / "cuda_sanitizer_api" / "compute-sanitizer" / "compute-sanitizer")
    return out


def _lacks_launcher(path: Path) -> bool:
    """The 13.0-13.3 wheels ship the binary in bin/ without TreeLauncherSubreaper, and it then
    launches nothing ("Target application terminated before first instrumented API call",
    seen on the H200 box with 13.0.85). From 13.4 the wheel's bin/ entry is a script that
    runs ../compute-sanitizer/compute-sanitizer, where the helper is."""
    if path.parent.name != "bin" or (path.parent / "TreeLauncherSubreaper").exists():
        return False
    with open(path, "rb") as fh:
        is_elf = fh.read(4) == b"\x7fELF"
    return is_elf and not (path.parent.parent / "compute-sanitizer" / "TreeLauncherSubreaper").exists()


def find() -> str:
    """The compute-sanitizer binary: $MPK_COMPUTE_SANITIZER, else `compute-sanitizer` on PATH,
    else the pip wheel's copy, else the CUDA toolkit's ($CUDA_HOME, /usr/local/cuda)."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        path = Path(configured).expanduser()
        if _executable(path):
            return str(path)
        on_path = shutil.which(configured)
        if on_path:
            return on_path
        raise SanitizerMissing(f"{ENV_VAR}={configured!r} is not an executable file: point it "
                               "at compute-sanitizer, or unset it to search PATH and the "
                               f"{WHEEL} wheel")
    on_path = shutil.which("compute-sanitizer")
    if on_path:
        return on_path
    wheel = _wheel_candidates()
    candidates = wheel + toolkit_copies("compute-sanitizer")
    for path in candidates:
        if _executable(path):
            if path in wheel and _lacks_launcher(path):
                raise SanitizerMissing(
                    f"{path} is from an {WHEEL} wheel without TreeLauncherSubreaper: it cannot "
                    f"launch the gate. Install {WHEEL}>=13.4 (`pip install -e .[sanitize]`), or "
                    f"point {ENV_VAR} at a CUDA toolkit's compute-sanitizer.")
            return str(path)
    present = [p for p in candidates if p.is_file()]
    if present:
        raise SanitizerMissing(f"{present[0]} exists but is not executable (chmod +x it, or set "
                               f"{ENV_VAR}). {MISSING_HELP}")
    raise SanitizerMissing(MISSING_HELP)


# ---------------------------------------------------------------- the command
def wrap(tool: str, cmd: list[str], log_file: Path, kernel: str | None = None) -> list[str]:
    """The full command running `cmd` (a gate runner) under compute-sanitizer TOOL.

    The tool's report goes to `log_file` (the runner's own output stays in the gate log).
    With `kernel`, only the harness's kernels (`<kernel>__<variant>`) are instrumented: torch's
    own kernels run unchecked, which is faster and keeps their reports out of the verdict.
    """
    if tool not in TOOLS:
        raise ValueError(f"sanitize={tool!r}: expected one of {', '.join(TOOLS)}")
    args = [find(), "--tool", tool,
            "--log-file", str(log_file).replace("%", "%%"),   # % starts an escape there
            "--error-exitcode", str(ERROR_EXITCODE),
            "--print-limit", str(PRINT_LIMIT),
            # the runner is a Python process; follow it (and anything it starts)
            "--target-processes", "all",
            "--launch-timeout", str(LAUNCH_TIMEOUT_S),
            # host frames through Python and ctypes say nothing; device frames may
            "--show-backtrace", "device"]
    if kernel:
        args += ["--kernel-name", f"kns={kernel}__"]
    if tool == "memcheck":
        # API errors are the runner's business (it turns a failed launch into `crash`), and
        # torch/the driver make calls that fail by design while probing
        args += ["--report-api-errors", "no", "--padding", str(PADDING_BYTES)]
    elif tool == "racecheck":
        # one line per race (source locations and a hazard count), not one per byte
        args += ["--racecheck-report", "analysis", "--racecheck-detect-level", "warn"]
    target = list(cmd)
    if tool == "memcheck":
        env = shutil.which("env") or "/usr/bin/env"
        target = [env, *(f"{k}={v}" for k, v in MEMCHECK_ENV.items()), *target]
    return [*args, "--", *target]


# ---------------------------------------------------------------- reading the report
# not "ERROR SUMMARY: 204 errors were not printed" (past --print-limit; already counted)
_SUMMARY_ERRORS = re.compile(r"ERROR SUMMARY:\s*([\d,]+) errors?\b(?!\s+were not printed)")
_SUMMARY_RACE = re.compile(r"RACECHECK SUMMARY:\s*([\d,]+) hazards? displayed\s*"
                           r"\(([\d,]+) errors?,\s*([\d,]+) warnings?\)")
_SEVERITY = r"(?:Error|ERROR|Warning|WARNING|WARN|Info|INFO)\s*(?:\([^)]*\))?\s*:\s*"
# (kind, pattern) for the first line of a finding; the first match wins
_FINDINGS = [
    ("memory", re.compile(r"^Invalid __(?:global|shared|local)__ (?:read|write|atomic)")),
    ("memory", re.compile(r"^Potential invalid __(?:shared|global)__")),
    ("race", re.compile(rf"^(?:{_SEVERITY})?(?:Race reported between|Potential (?:RAW|WAR|WAW) hazard)")),
    ("sync", re.compile(r"^Barrier error detected|^Warpgroup MMA sequence error detected")),
    ("deadlock", re.compile(r"^Deadlock detected")),
    ("malloc", re.compile(r"^Malloc/Free error")),
    ("init", re.compile(r"^Uninitialized __(?:global|shared)__ memory")),
    ("hardware", re.compile(r"^(?:Warp |Lane |Device )?(?:Illegal (?:Address|Instruction)|"
                            r"Misaligned (?:Address|PC|Shared or Local Address)|"
                            r"Out-of-range (?:Address|Shared or Local Address)|Invalid (?:PC|Address Space)|"
                            r"(?:Hardware|User) Stack Overflow|Assert)")),
    ("leak", re.compile(r"^Leaked [\d,]+ bytes")),
    ("api", re.compile(r"^Program hit .* on CUDA API call")),
]
# first lines that say the tool itself failed (not a finding in the application)
_TOOL_FAILURE = re.compile(r"^(?:Error\b|Internal Sanitizer Error|Target application doesn't exist|"
                           r"Unable to|Could not|Failed to|The (?:driver|device|application) )")
# detail lines that only point at frames (the report keeps them)
_NOISE = re.compile(r"^(?:Saved host backtrace|Host Frame|Device Frame|\.\.\.|\[\.\.\.\]|=+$)")
# detail lines a collapsed report may print without their indentation
_DETAIL = re.compile(r"^(?:at |and |by thread|in |Address |Access |Read Thread|Write Thread|"
                     r"Current Value|Device Frame|Saved host backtrace|Host Frame)")
# "name(const float *, float *)+0x70" -> "name+0x70" (also after "name<128>"): the parameter
# lists only add noise
_PARAMS = re.compile(r"([\w>])\((?:[^()]|\([^()]*\))*\)(?=\+0x|:0x)")
_HARNESS_KERNEL = re.compile(r"\b([A-Za-z_]\w*?)__([A-Za-z_]\w*)(?=\+0x|:0x|\(| in |\b)")


@dataclass
class Finding:
    kind: str
    lines: list[str] = field(default_factory=list)   # first line, then the details

    def describe(self) -> str:
        """One line: what, where (kernel, file:line), who (thread/block), which address."""
        head = self.lines[0]
        if self.kind == "race":
            head = re.sub(rf"^{_SEVERITY}", "", head)
        details = [_PARAMS.sub(r"\1", d) for d in self.lines[1:] if not _NOISE.match(d)]
        text = ", ".join([_PARAMS.sub(r"\1", head).rstrip(" :."), *details])
        # the variant: from the finding's own location, else from its device frames (a fault
        # inside the inlined task function is located there; the harness kernel is a frame)
        m = _HARNESS_KERNEL.search(text) or next(
            (m for line in self.lines[1:] if (m := _HARNESS_KERNEL.search(line))), None)
        return f"variant {m.group(2)}: {text}" if m else text


@dataclass
class Report:
    findings: list[Finding]
    tool_failures: list[str]          # first lines saying the tool did not run properly
    errors: int | None                # ERROR SUMMARY, summed over processes
    race: tuple[int, int, int] | None  # RACECHECK SUMMARY: displayed, errors, warnings
    target_failed: bool = False       # "Target application returned an error"

    @property
    def finished(self) -> bool:
        return self.errors is not None or self.race is not None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse(report_text: str) -> Report:
    """Split compute-sanitizer's text report into findings, summaries and tool failures.
    Lines without the ========= prefix (application output, if any) are ignored."""
    bodies = []
    for raw in report_text.splitlines():
        line = raw.rstrip()
        if line.startswith(PREFIX):
            bodies.append(line[len(PREFIX):])
    findings: list[Finding] = []
    failures: list[str] = []
    current: Finding | None = None
    target_failed = False
    for body in bodies:
        text = body.strip()
        if not text:
            current = None
            continue
        indented = body.startswith("  ")
        if current is not None and (indented or _DETAIL.match(text)):
            current.lines.append(text)
            continue
        current = None
        if text.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY")):
            continue
        if text.startswith("Target application returned an error"):
            target_failed = True      # the runner's exit status: its own result says why
            continue
        kind = next((k for k, rx in _FINDINGS if rx.search(text)), None)
        if kind is not None:
            current = Finding(kind, [text])
            findings.append(current)
        elif _TOOL_FAILURE.match(text):
            failures.append(text)
    flat = " ".join(b.strip() for b in bodies)   # a summary may wrap onto a second line
    errors = [_int(m.group(1)) for m in _SUMMARY_ERRORS.finditer(flat)]
    races = [tuple(_int(g) for g in m.groups()) for m in _SUMMARY_RACE.finditer(flat)]
    race = tuple(sum(col) for col in zip(*races)) if races else None
    return Report(findings, failures, sum(errors) if errors else None, race, target_failed)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def verdict(tool: str, report_text: str, exit_code: int, runner_result: dict | None) -> dict | None:
    """The gate result the sanitizer's report makes, or None when it found nothing (the
    runner's own result stands).

    Call it once the wrapped command ended by itself (a run the watchdog killed is a hang,
    whatever its report holds). `report_text` is the --log-file's contents ("" if the file was
    never written); `exit_code` the wrapped command's; `runner_result` the runner's own result
    (None when it wrote none). Findings give `fail` with check `sanitize:<tool>`; a report
    without its summary (the tool failed to start, or died) gives `crash`: never a pass.
    """
    if tool not in TOOLS:
        raise ValueError(f"sanitize={tool!r}: expected one of {', '.join(TOOLS)}")
    rep = parse(report_text)
    check = f"sanitize:{tool}"
    runner = None
    if runner_result is not None:
        runner = {k: runner_result[k] for k in ("verdict", "message") if k in runner_result}
    # device-side findings first: an API error is usually the consequence of one
    ordered = sorted(rep.findings, key=lambda f: f.kind in ("api", "leak"))
    if tool == "racecheck" and rep.race is not None:
        displayed, errs, warns = rep.race
        count = max(displayed, len(rep.findings))
        counted = (f"{_plural(count, 'race')} reported ({_plural(errs, 'error')}, "
                   f"{_plural(warns, 'warning')})")
        found = count > 0 or errs > 0 or warns > 0
    else:
        count = rep.errors if rep.errors is not None else len(rep.findings)
        count = max(count, len(rep.findings))
        counted = _plural(count, "error")
        # the tool may count the runner's own non-zero exit as an error: that alone is the
        # runner's failure, which its result (or the executor's crash) already reports
        found = count > (1 if rep.target_failed and not rep.findings else 0)
    if found:
        first = ordered[0].describe() if ordered else (
            "none of them in a form this build reads; see the report")
        result = {"verdict": "fail", "check": check,
                  "message": f"{tool}: {counted}; first: {first}",
                  "errors": count,
                  "findings": [f.describe() for f in ordered[:5]],
                  "report_tail": _tail(report_text)}
        if runner is not None:
            result["runner"] = runner
        return result
    if rep.finished:
        if exit_code == ERROR_EXITCODE:
            return {"verdict": "fail", "check": check, "errors": 0, "runner": runner,
                    "message": f"{tool}: compute-sanitizer exited {ERROR_EXITCODE} (its "
                               "errors-found code) but its summary counts none; see the report",
                    "report_tail": _tail(report_text)}
        return None
    if rep.tool_failures:
        why = "; ".join(dict.fromkeys(rep.tool_failures))
    elif not report_text.strip():
        why = "it wrote no report (see the gate log for its own error)"
    else:
        why = "its report has no summary (it stopped before the end)"
    message = f"{tool}: compute-sanitizer did not complete (exit code {exit_code}): {why}"
    if runner is not None and runner.get("verdict") not in (None, "pass"):
        said = (runner.get("message") or "").strip().splitlines()
        message += f"; the runner itself: {runner['verdict']}: {said[0] if said else ''}"
    return {"verdict": "crash", "check": check, "errors": 0, "message": message,
            "runner": runner, "report_tail": _tail(report_text)}


def finish(tool: str, report_text: str, exit_code: int, result: dict) -> dict:
    """The gate's result: the report's verdict where it has one, else the runner's own;
    either way it says which tool watched the run."""
    found = verdict(tool, report_text, exit_code, result)
    if found is not None:
        found.setdefault("elapsed_s", result.get("elapsed_s"))
        found["runner_verdict"] = result.get("verdict")
        result = found
    return {**result, "sanitize": tool}
