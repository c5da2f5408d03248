"""Nsight Compute as the profile gate's tool wrapper (run.job.ToolWrapper): the command that
runs the profile runner under `ncu`, and its report read back into the runner's result.

The runner (runners/profile.py) launches each chosen variant once, and an empty kernel
(torch's `spin_kernel`, zero cycles) first: ncu profiles those launches only (a kernel-name
filter; torch's own kernels, which make the inputs, run unprofiled), replaying each until
it has every metric below, with the caches flushed before each pass (cold, as a decode
step's kernel meets them) and the clocks left as they are. The report is ncu's raw page
as CSV (base units: ns, byte; numbers with thousands separators), one row per profiled
launch, named by its demangled signature: a header row, a units row, then the rows (every
metric ncu collected, device attributes included: columns are found by name); ncu's own
messages are the lines starting with `==`.

Where ncu cannot read the counters (a machine that refuses them says "LibraryNotLoaded" or
ERR_NVGPUCTRPERM) the result says so, with ncu's words, and is `unavailable`: not passed.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
from pathlib import Path

from mpkbuild.run.job import ToolMissing
from mpkbuild.util.toolchain import toolkit_copies

ENV_VAR = "MPK_NCU"
# ncu replays every profiled launch several times (one pass per group of counters), and
# starts slower than the runner's own start-up
TIMEOUT_FACTOR = 4.0
FLOOR_KERNEL = "spin_kernel"          # torch.cuda._sleep(0): the launch floor
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "registers": "launch__registers_per_thread",
}
STALLS = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
STALL_METRICS = r"regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"
# "selected" is the warp being issued, not a stall
NOT_A_STALL = ("selected",)
# ncu's words when it cannot read the hardware counters on this machine
NO_COUNTERS = re.compile(r"LibraryNotLoaded|ERR_NVGPUCTRPERM|permission to access NVIDIA GPU "
                         r"Performance Counters|Failed to initialize the profiler|"
                         r"not supported on this (?:device|GPU)|Profiling is not supported", re.I)
MISSING_HELP = (f"Nsight Compute (ncu) was not found: put the CUDA toolkit's or Nsight Compute's "
                f"folder on PATH, or set {ENV_VAR}=/path/to/ncu")


def find() -> str:
    """$MPK_NCU, else `ncu` on PATH, else the CUDA toolkit's, else /opt/nvidia/nsight-compute's
    newest."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        path = shutil.which(configured) or (configured if os.access(configured, os.X_OK) else None)
        if path is None:
            raise ToolMissing(f"{ENV_VAR}={configured!r} is not an executable: point it at ncu, or "
                              "unset it to search PATH")
        return path
    found = shutil.which("ncu")
    if found:
        return found
    newest_first = sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"), reverse=True)
    for path in toolkit_copies("ncu") + newest_first:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise ToolMissing(MISSING_HELP)


def wrap(option: str, cmd: list[str], report: Path, kernel: str) -> list[str]:
    """The command running the profile runner under ncu, its CSV report going to `report`."""
    names = rf"regex:^({FLOOR_KERNEL}|{re.escape(kernel)}__[A-Za-z0-9_]+)$"
    return [find(), "--target-processes", "all", "--clock-control", "none",
            "--cache-control", "all", "--replay-mode", "kernel", "--print-units", "base",
            "--kernel-name-base", "function", "--kernel-name", names,
            "--metrics", ",".join([*METRICS.values(), STALL_METRICS]),
            "--csv", "--page", "raw", "--log-file", str(report), "--", *cmd]


def _strip_tail(text: str, close: str, open_: str) -> str:
    """text without its trailing bracketed part (parameters, template arguments), nested
    brackets included."""
    text = text.rstrip()
    if not text.endswith(close):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += (text[i] == close) - (text[i] == open_)
        if depth == 0:
            return text[:i].rstrip()
    return text


def function_name(signature: str) -> str:
    """The function's own name in ncu's Kernel Name, a demangled signature whatever
    --kernel-name-base matched on ("at::<unnamed>::spin_kernel(long)",
    "linear_v2__large(const __nv_bfloat16 *, ...)"): no namespace, return type, template
    arguments or parameters."""
    head = _strip_tail(_strip_tail(signature, ")", "("), ">", "<")
    return head.rsplit("::", 1)[-1].rsplit(" ", 1)[-1]


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def parse(report_text: str) -> tuple[list[dict], list[str]]:
    """(rows, messages): each profiled launch as {kernel, metric: value} (the names of
    METRICS, and `stalls`: reason -> warps stalled per issued instruction), and ncu's own
    `==` lines."""
    messages = [ln.strip() for ln in report_text.splitlines() if ln.startswith("==")]
    table = [ln for ln in report_text.splitlines() if ln.strip() and not ln.startswith("==")]
    records = list(csv.reader(table))
    start = next((i for i, r in enumerate(records) if r and r[0] == "ID"), None)
    if start is None:
        return [], messages
    header = records[start]
    body = records[start + 1:]
    if body and (not body[0][0].strip() or not any(_number(c) is not None for c in body[0][1:])):
        body = body[1:]                               # the units row
    col = {name: i for i, name in enumerate(header)}
    wanted = {key: col[m] for key, m in METRICS.items() if m in col}
    stalls = {m.group(1): i for name, i in col.items() if (m := STALLS.match(name))}
    rows = []
    for rec in body:
        if len(rec) != len(header):
            continue
        row = {"kernel": function_name(rec[col["Kernel Name"]]) if "Kernel Name" in col else ""}
        for key, i in wanted.items():
            row[key] = _number(rec[i])
        row["stalls"] = {r: v for r, i in stalls.items()
                         if r not in NOT_A_STALL and (v := _number(rec[i])) is not None}
        rows.append(row)
    return rows, messages


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def finish(option: str, report_text: str, exit_code: int, result: dict) -> dict:
    """The runner's `launched` result with ncu's figures per variant (`profiled`), or
    `unavailable` with ncu's words where it measured nothing (or not every variant); a
    runner that failed keeps its own verdict, with ncu's errors beside it."""
    rows, messages = parse(report_text)
    errors = [m for m in messages if m.startswith("==ERROR==")]
    if result.get("verdict") != "launched":
        if errors:
            result = {**result, "ncu_errors": errors[:5]}
        return result
    kernel = result.get("kernel", "")
    floor = [r["duration_ns"] for r in rows if r["kernel"] == FLOOR_KERNEL and r.get("duration_ns")]
    by_variant = {r["kernel"][len(kernel) + 2:]: r for r in rows
                  if r["kernel"].startswith(f"{kernel}__")}
    missing = [v for v in result["launched"] if v not in by_variant]
    if not rows or missing:
        no_counters = next((m for m in errors if NO_COUNTERS.search(m)), None)
        if no_counters:
            message = f"ncu could not read the hardware counters on this machine: {no_counters}"
        else:
            said = errors[0] if errors else f"it wrote no row for them (exit code {exit_code})"
            message = f"ncu measured no launch of {', '.join(missing) or 'any variant'}: {said}"
        return {**result, "verdict": "unavailable", "ncu_exit": exit_code, "message": message,
                "ncu_errors": errors[:5], "report_tail": _tail(report_text)}
    variants = {v: {k: x for k, x in by_variant[v].items() if k != "kernel"} for v in result["launched"]}
    return {**result, "verdict": "profiled", "variants": variants,
            "floor_ns": min(floor) if floor else None,
            "message": f"ncu profiled {len(variants)} variants"}
