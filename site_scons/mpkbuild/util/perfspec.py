"""The perf section's baselines, bytes and ceilings, read the same way on both sides
(the runner and the build). Standard library only.

- Baselines: `perf.baseline` (a Python function, path:name) is the primary baseline, named
  "torch" (what `max_time_vs_baseline` judges unless a rule names another); `perf.baselines`
  adds more: [{name, function, compile, mode}] where `compile: true` times
  `torch.compile(function, dynamic=False, mode=mode)`, compiled once per variant before
  timing (the compile time is recorded, not timed).
- Bytes: `perf.bytes` is either one expression, the total bytes moved per launch (judged
  against the copy ceiling, 1:1 read:write, as before), or {read: expr, write: expr}; the
  build resolves them per variant (util/expr.variant_facts).
- Ceilings: the bandwidth node measures read-only, 2:1 and 1:1 (copy) streams; a kernel's
  ceiling is the one for its read share read / (read + write), interpolated linearly
  between the measured mixes (read share 1/2, 2/3, 1); below 1/2 (write-heavy) the copy's.
"""
from __future__ import annotations

PRIMARY = "torch"
MIXES = (("1:1", 0.5), ("2:1", 2.0 / 3.0), ("read", 1.0))


def baselines(pcfg: dict) -> list[dict]:
    """[{name, function, compile, mode}], the primary first."""
    out = [{"name": PRIMARY, "function": pcfg["baseline"], "compile": False, "mode": None}]
    for b in pcfg.get("baselines", []) or []:
        compiled = bool(b.get("compile", False))
        out.append({"name": b["name"], "function": b["function"], "compile": compiled,
                    "mode": (b.get("mode") or "default") if compiled else None})
    return out


def ceiling(bandwidth: dict, read: float | None, write: float | None) -> dict:
    """{mix, read_share, Bps} from a bandwidth node's result; the copy's when the spec gave
    one total or the node measured only the copy."""
    copy = bandwidth["copy_bandwidth_Bps"]
    measured = bandwidth.get("ceilings_Bps") or {}
    if read is None or write is None or not all(m in measured for m, _ in MIXES):
        return {"mix": "1:1", "read_share": None, "Bps": copy}
    share = read / (read + write) if read + write > 0 else 0.5
    if share <= MIXES[0][1]:
        return {"mix": "1:1", "read_share": share, "Bps": measured["1:1"]}
    for (m0, s0), (m1, s1) in zip(MIXES, MIXES[1:]):
        if share <= s1:
            t = (share - s0) / (s1 - s0)
            bps = measured[m0] + t * (measured[m1] - measured[m0])
            name = m1 if abs(share - s1) < 1e-9 else (m0 if abs(share - s0) < 1e-9 else f"{m0}..{m1}")
            return {"mix": name, "read_share": share, "Bps": bps}
    return {"mix": "read", "read_share": share, "Bps": measured["read"]}


def paired_kernel(result: dict, figure: str, baseline_figure: dict) -> dict:
    """The kernel's figure that a baseline's figure was timed beside (the pair its ratio
    needs): for a figure timed over buffer placements (runners/placement.py), the kernel's
    in the baseline's placement; otherwise the kernel's figure. The runner and the build's
    judge both pair through this."""
    where = baseline_figure.get("placement")
    for entry in (result.get(f"{figure}_placements") or {}).get("placements", ()):
        if entry["placement"] == where:
            return entry["kernel"]
    return result[figure]
