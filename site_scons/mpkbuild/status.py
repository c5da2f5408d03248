"""Status: which nodes a build would run and why, computed without running anything.

Plain `scons -n` lists only actions whose direct inputs already changed. Here every node
of the graph model (mpkbuild.model.graph) is judged in order against what SCons recorded for it
(.sconsign: the signature of each input at its last successful build). The outputs of
cheap deterministic nodes (spec normalisation, rendering, the wire fragments) are computed
in memory, so a node downstream of them is stale only when their bytes would really
change; the outputs of every other node that would run (nvcc, GPU gates, review) are taken
as changing. A gate is assumed to keep its verdict. The result is the exact set of actions
a build would execute, each with concrete reasons.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mpkbuild import stages
from mpkbuild.model.graph import CHANGED, Graph, Node
from mpkbuild.sconsign import Sconsign, action_signature
from mpkbuild.util.fsutil import ReadOnce, scons_signature
# how a reason about the tuned file a spec applies begins: said first, before its fields
TUNED_REASON = "tuned config"


@dataclass
class NodeStatus:
    label: str
    kind: str
    stage: str
    kernel: str | None
    state: str                      # fresh | stale | failed | never run | pending
    reasons: list[str] = field(default_factory=list)
    will_run: bool = False
    verdict: str | None = None      # a gate's stored verdict, when it has one
    delta: str | None = None        # perf: the last result against the last accepted one
    gate: bool = False              # it makes a verdict (what `check` requires fresh)
    column: str = ""                # its column in the table (model.graph.Node.column)
    waits: str | None = None        # pending TIER-1: the hardware it needs (model.graph.Node.waits)


def _flatten(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def section_changes(old_text: str | None, new: dict, limit: int = 4) -> list[str]:
    """'spec field `validate.rel_max` changed 0.03 -> 0.02' for each changed leaf."""
    if old_text is None:
        return ["spec section is new"]
    try:
        old = dict(_flatten(json.loads(old_text)))
    except ValueError:
        return ["spec section file is unreadable"]
    cur = dict(_flatten(new))
    out = []
    for key in sorted(set(old) | set(cur)):
        if old.get(key, "<absent>") != cur.get(key, "<absent>"):
            out.append(f"spec field `{key}` changed {_short(old.get(key, '<absent>'))} -> "
                       f"{_short(cur.get(key, '<absent>'))}")
    if len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more spec fields"]
    return out or ["spec section rewritten (same fields)"]


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _fact_kind(fact: str) -> str:
    return fact.split(":", 1)[0]


def _fact_change(old: str, new: str, code=None) -> str:
    kind = _fact_kind(new)
    strip = lambda f: f.split(":", 1)[1].strip()
    if kind == "code":
        name, digest = strip(new).rsplit(" ", 1)
        changed = code.changed_files(strip(old).rsplit(" ", 1)[-1], digest) if code else None
        return (f"the code of {name} changed: " + ", ".join(changed[:4])
                + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")) if changed else \
            f"the code of {name} changed"
    if kind == "toolchain":
        return f"{strip(old).split(';')[0]} -> {strip(new).split(';')[0]}" \
            if strip(old).split(";")[0] != strip(new).split(";")[0] else \
            f"nvcc flags {strip(old).split('flags:')[-1].strip()} -> {strip(new).split('flags:')[-1].strip()}"
    if kind == "gpu":
        return _gpu_change(strip(old), strip(new))
    if kind == "spec":
        return "the normalised spec changed"
    if kind == "tuned":
        return f"{TUNED_REASON} {strip(old)} -> {strip(new)}"
    return f"{kind} {strip(old)} -> {strip(new)}"


def _gpu_change(old: str, new: str) -> str:
    """A GPU fact's change; torch's version is part of it (gpu.GpuFingerprint.signature), so
    a new torch alone is said as such: the results were taken in another environment."""
    parts = lambda s: dict(p.strip().split("=", 1) for p in s.split(";") if "=" in p)
    a, b = parts(old), parts(new)
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if changed == ["torch"]:
        return (f"torch {a['torch']} -> {b['torch']}: results taken with another torch are another "
                "GPU profile's, not this environment's (install the torch they were taken with, "
                "or run the gates again)")
    return f"GPU {old} -> {new}"


class Predictor:
    """Computes the new bytes of deterministic outputs in memory (no files written): each
    stage module's `predict` says what its node writes, or None when that cannot be known
    without running it."""

    def __init__(self, root: Path, kernels: dict, wire_request, wiring_root: Path, runtime_request=None,
                 gpu_key: str | None = None):
        self.root, self.kernels = root, kernels
        self.wire_request, self.wiring_root = wire_request, wiring_root
        self.runtime_request, self.gpu_key = runtime_request, gpu_key

    def outputs(self, node: Node) -> dict[str, object]:
        predicted = stages.BY_NAME[node.stage].impl.predict(node, self.kernels.get(node.kernel), self)
        return {t: CHANGED for t in node.targets} if predicted is None else predicted


def compute(g: Graph, sconsign: Sconsign, predictor: Predictor, gpu_here: bool,
            only: set[str] | None = None, files: ReadOnce | None = None) -> list[NodeStatus]:
    """Judge every node (or those labelled in `only`) in graph order. files: the reads the
    graph was planned with (g.files, the default), so no file is read twice."""
    files = g.files if files is None else files
    producers = g.producers()
    action_sig = action_signature()
    predicted: dict[str, object] = {}        # target -> new bytes or CHANGED (nodes that run)
    out = []
    for node in g.nodes:
        if node.waits:                        # never declared: it cannot run on this profile
            if only is None or node.label in only:
                out.append(NodeStatus(node.label, node.kind, node.stage, node.kernel, "pending", [node.waits],
                                      column=node.column, waits=node.waits))
            continue
        reasons, never = _judge(node, g.root, sconsign, producers, predicted, files, g.code, action_sig)
        will_run = bool(reasons)
        if will_run:
            try:
                for target, data in predictor.outputs(node).items():
                    predicted[target] = data
            except Exception as exc:      # a render error: the build would fail right there
                reasons.append(f"would fail: {exc}")
                for t in node.targets:
                    predicted[t] = CHANGED
        if will_run and node.fields:
            # the tuned file it applies is named, then the fields that changed
            tuned = [r for r in reasons if r.startswith(TUNED_REASON)]
            reasons = tuned + (_spec_field_changes(node, g.root, predicted) or
                               [r for r in reasons if r not in tuned])
        if only is not None and node.label not in only:
            continue
        verdict = _stored_verdict(g, node, files)
        if not will_run:
            state = "fresh"
        elif node.on_gpu and not gpu_here:
            state = "pending"
            reasons.insert(0, "no GPU of this profile here")
        elif verdict not in (None, "pass", *node.outcomes):
            state = "failed"
        elif never:
            state = "never run"
        else:
            state = "stale"
        delta = _note(g, node, files)
        out.append(NodeStatus(node.label, node.kind, node.stage, node.kernel, state, reasons,
                              will_run, verdict, delta, node.verdict_file is not None, node.column))
    return out


def _note(g: Graph, node: Node, files: ReadOnce) -> str | None:
    """The stage's own line about a gate node (perf: against the accepted results), from the
    module its row names (`note`)."""
    row = stages.BY_NAME.get(node.stage)
    if node.kind != "gate" or row is None or row.note is None:
        return None
    module, function = row.note.split(":")
    return getattr(importlib.import_module(module), function)(g.root, node, files)


def _spec_field_changes(node: Node, root: Path, predicted) -> list[str]:
    """For the spec node: which fields of which sections the edit changed."""
    out = []
    for target in node.targets[1:]:
        new = predicted.get(target)
        if isinstance(new, bytes):
            old = _read(root / target)
            if old is None or old.encode() != new:
                out.extend(section_changes(old, json.loads(new)))
    return out


def _stored_verdict(g: Graph, node: Node, files: ReadOnce) -> str | None:
    rel = node.verdict_file
    if rel is None:
        return None
    if rel in g.stored:                      # read once already, while the graph was built
        return g.stored[rel][0]
    res = files.json(rel)                    # its bytes serve the gates' input hash too
    return res.get("verdict") if res is not None else None


def _judge(node: Node, root: Path, sconsign: Sconsign, producers, predicted,
           files: ReadOnce, code=None, action_sig: str | None = None) -> tuple[list[str], bool]:
    """Why the node would run (empty: it would not), and whether it never ran. Every file
    input is judged by its content signature: an mtime and size that match what was
    recorded prove nothing (`cp -p`, `rsync -t` and a restored cache put mtimes back), so,
    as the build does (SCons runs with max_drift -1), every input is hashed."""
    reasons = []
    if node.always:
        reasons.append(node.always)
    entry = sconsign.entry(node.targets[0])
    binfo = getattr(entry, "binfo", None)
    if binfo is None or not hasattr(binfo, "bsources"):
        return reasons + ["never run"], True
    if action_sig is not None and getattr(binfo, "bactsig", None) != action_sig:
        reasons.append("the build tool's action signature changed (another mpkbuild action version)")
    for t in node.targets:
        if not files.exists(t):
            reasons.append(f"output {t} is missing")
    recorded = dict(zip(binfo.bsources, binfo.bsourcesigs))
    wanted = {*node.sources, *node.facts}
    for fact in node.facts:
        if fact not in recorded:
            old = next((r for r in recorded if _fact_kind(r) == _fact_kind(fact) and r not in wanted), None)
            reasons.append(_fact_change(old, fact, code) if old else
                           f"{TUNED_REASON} now applied: {fact.split(':', 1)[1].strip()}"
                           if _fact_kind(fact) == "tuned" else f"new input {_fact_kind(fact)}")
    for src in node.sources:
        rec = recorded.get(src)
        if rec is None:
            reasons.append(f"new input {src}")
            continue
        if src in predicted:
            new = predicted[src]
            producer = producers[src]
            if new is CHANGED:
                reasons.append(f"upstream {producer.label} will run")
                continue
            if scons_signature(new) == getattr(rec, "csig", None):
                continue
            if producer.fields and "/spec/" in src:
                reasons.extend(section_changes(_read(root / src), json.loads(new)))
            else:
                reasons.append(f"upstream {producer.label} changes {src}")
            continue
        cur = files.signature(src)
        if cur != getattr(rec, "csig", None):
            reasons.append(f"{src} {'is missing' if cur is None else 'changed'}")
    removed = [r for r in recorded if r not in wanted and not any(
        _fact_kind(r) == _fact_kind(f) for f in node.facts)]
    if removed:
        reasons.append(f"inputs removed: {', '.join(removed[:3])}")
    return _dedupe(reasons), False


def _dedupe(items: list[str]) -> list[str]:
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# ---------------------------------------------------------------- rendering
def table(statuses: list[NodeStatus], gpu_key: str, details: bool = False) -> str:
    """kernel x gate: one cell per stage (worst state of its nodes), then the reasons of
    what changed (stale, failed); with `details` every non-fresh node's, pending and never
    run ones too (those are otherwise counted in one line)."""
    order = {"failed": 0, "pending": 1, "never run": 2, "stale": 3, "fresh": 4}
    cells: dict[str, dict[str, str]] = {}
    cols: list[str] = []                     # in graph order
    for st in statuses:
        if st.kernel is None or st.kind == "check":
            continue
        col = st.column
        if col not in cols:
            cols.append(col)
        row = cells.setdefault(st.kernel, {})
        prev = row.get(col)
        if prev is None or order[st.state] < order[prev]:
            row[col] = st.state
    width = max([len(k) for k in cells] + [6])
    names = [c if c not in stages.GPU_GATES else f"{c}@gpu" for c in cols]
    widths = [max(len(n), 9) for n in names]
    head = f"{'kernel':<{width}}  " + "  ".join(f"{n:<{w}}" for n, w in zip(names, widths))
    lines = [f"GPU profile: {gpu_key}", head]
    for kname in sorted(cells):
        lines.append(f"{kname:<{width}}  " + "  ".join(f"{cells[kname].get(c, '-'):<{w}}"
                                                     for c, w in zip(cols, widths)))
    detail = [st for st in statuses if st.state != "fresh" and st.kind != "check"]
    lines.append("" if detail else "\neverything is fresh")
    quiet = {"pending", "never run"}
    for st in detail:
        if details or st.state not in quiet or st.waits:
            lines.append(f"{st.label}: {st.state}")
            lines.extend(f"    {reason}" for reason in st.reasons)
    held = [st for st in detail if st.state in quiet and not st.waits]
    if held and not details:
        counts = {s: sum(st.state == s for st in held) for s in ("pending", "never run")}
        lines.append(", ".join(f"{n} {s}" for s, n in counts.items() if n)
                     + (" (pending: no GPU of this profile here)" if counts["pending"] else "")
                     + "; `scons status --details` lists them with their reasons")
    deltas = [st for st in statuses if st.delta]
    if deltas:
        lines.append("\nperf against the accepted results (perf_history/):")
        lines.extend(f"  {st.kernel}: {st.delta}" for st in deltas)
    return "\n".join(lines)


def to_json(statuses: list[NodeStatus], gpu_key: str) -> str:
    return json.dumps({"gpu_profile": gpu_key, "nodes": [asdict(s) for s in statuses]}, indent=2)
