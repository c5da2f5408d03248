"""Where an op's start spread goes inside MPK's v1 runtime (issue 58's "where the time goes":
the hand-out; bench/RESULTS.md section 31 left it open).

The runtime's profiler marks only a task's begin and end. This diagnostic, in a throwaway
copy of the project and of the checkout (bench/start_spread.sh makes both), adds a worker
mark from the moment its queue poll sees new entries to the moment their descriptors are in
shared memory (type FETCH), and has the runtime gate's runner keep each cold launch's
profiler columns. `parse` then splits each op iteration's path, from the event's push (the
worker that ends the previous layer, TASK_SCHD_EVENTS) to each task's start:
  pickup        push -> the first worker sees a task (a scheduler reads the event, enqueues)
  notice spread first to last worker seeing its task
  sched spread  first to last scheduler's first enqueue seen (its group of workers)
  in group      first to last task seen within one scheduler's workers (its serial enqueue)
  load          a worker's descriptor load; wait: loaded -> the task's start
  spread        first to last task start (the gate's start spread)

    python bench/start_spread.py patch MIRAGE_COPY SITE_SCONS_COPY
    python bench/start_spread.py parse DUMP_DIR
"""
from __future__ import annotations

import collections
import glob
import pathlib
import statistics as st
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "site_scons"))
from mpkbuild.runners.runtime import by_iteration  # noqa: E402

SCHD_EVENTS = 201             # runtime_header.h TASK_SCHD_EVENTS: the worker pushing an event
FETCH = 500                   # the added mark (a free 9-bit profiler type)
WORKERS_PER_SCHEDULER = 8     # 128 workers, 16 local schedulers on a 132-SM card

WORKER = "mpk/include/mirage/persistent_kernel/persistent_kernel.cuh"
POLLED = ("        assert(next_task_pos[queue_idx] + config.per_worker_queue_len >\n"
          "               last_task_pos[queue_idx]);\n      }\n      __syncthreads();\n")
LOADED = "      queue_pos = 0;\n      queue_len = num_loaded_tasks;\n"
LAUNCHED = "            hung = launch(lib, rt, g, done[whose])\n"
DUMP = """\
            if os.environ.get("SPREAD_DUMP") and state == states[-1] and p < 6 and not hung:
                _nb = int(prof[0].item()) & 0xFFFFFFFF
                _cols = prof[1:1 + (len(prof) - 1) // _nb * _nb].view(-1, _nb).t()[:, :96].cpu().clone()
                torch.save({"body": _cols, "types": sorted(set(types)), "graph": g["name"], "whose": whose,
                            "iterations": per_launch(lib, rt["iterations"])},
                           os.path.join(os.environ["SPREAD_DUMP"], "".join(
                               c if c.isalnum() or c in "._-" else "_" for c in f"{g['name']}__{whose}__{p}.pt")))
"""


def patch(mirage: pathlib.Path, site: pathlib.Path) -> None:
    """The FETCH marks into the checkout copy's worker; the dump into the runner copy."""
    worker = mirage / WORKER
    text = worker.read_text()
    assert text.count(POLLED) == 1 and text.count(LOADED) == 1, f"{worker}: the anchors moved"
    mark = "#ifdef MPK_ENABLE_PROFILING\n      PROFILER_EVENT_{}(%d, task_counter);\n#endif\n" % FETCH
    sync = "      __syncthreads();\n"
    text = text.replace(POLLED, POLLED.replace(sync, mark.format("START") + sync))
    worker.write_text(text.replace(LOADED, LOADED + mark.format("END")))
    runner = site / "mpkbuild/runners/runtime.py"
    text = runner.read_text()
    assert text.count(LAUNCHED) == 1, f"{runner}: the anchor moved"
    runner.write_text(text.replace(LAUNCHED, LAUNCHED + DUMP))     # runtime.py imports os


def columns(body) -> list[list[tuple[int, int, int]]]:
    """Per worker its (time, type, phase) records, the written prefix of its column."""
    out = []
    for col in body.tolist():
        seq = []
        for x in col:
            if x == 0:
                break
            tag = x & 0xFFFFFFFF
            seq.append(((x >> 32) & 0xFFFFFFFF, (tag >> 2) & 0x1FF, tag & 3))
        out.append(seq)
    return out


def iterations(dump: dict) -> list[dict]:
    """One row of figures (µs) per op iteration of one dumped launch."""
    cols = columns(dump["body"])
    times = [t for seq in cols for t, _, _ in seq]
    if not times:
        return []
    ref = min(times)
    rel = lambda t: ((t - ref + 2**31) & 0xFFFFFFFF) - 2**31    # %globaltimer_lo wraps
    types, tasks, pushes = set(dump["types"]), [], []
    for w, seq in enumerate(cols):
        fetch_began, fetched, prev = None, None, None
        for t, kind, phase in seq:
            t = rel(t)
            if kind == FETCH:
                if phase == 0:
                    fetch_began = t
                else:
                    fetched = (fetch_began, t)
            elif kind == SCHD_EVENTS and phase == 1:
                pushes.append(t)
            elif kind in types and phase == 0:
                # only a task its worker fetched just before it (not the second of a batch)
                fresh = prev is not None and prev[1] == FETCH and prev[2] == 1
                tasks.append((t, w, fetched if fresh else None))
            prev = (t, kind, phase)
    rows = []
    for chunk in by_iteration(tasks, dump["iterations"]):      # the gate's own split
        first = chunk[0][0]
        push = max((p for p in pushes if p <= first), default=None)
        seen = [(s, w, f) for s, w, f in chunk if f]
        if not seen:
            continue
        notices = [f[0] for _, _, f in seen]
        groups = collections.defaultdict(list)
        for _, w, f in seen:
            groups[w // WORKERS_PER_SCHEDULER].append(f[0])
        firsts = [min(v) for v in groups.values()]
        rows.append({
            "tasks": len(chunk), "fetched": len(seen),
            "pickup": (min(notices) - push) / 1e3 if push is not None else float("nan"),
            "notice spread": (max(notices) - min(notices)) / 1e3,
            "sched spread": (max(firsts) - min(firsts)) / 1e3,
            "in group": st.median(max(v) - min(v) for v in groups.values()) / 1e3,
            "load": st.median(f[1] - f[0] for _, _, f in seen) / 1e3,
            "load max": max(f[1] - f[0] for _, _, f in seen) / 1e3,
            "wait": st.median(s - f[1] for s, _, f in seen) / 1e3,
            "wait max": max(s - f[1] for s, _, f in seen) / 1e3,
            "spread": (chunk[-1][0] - first) / 1e3})
    return rows


def parse(folder: str) -> str:
    import torch
    rows = collections.defaultdict(list)
    for path in sorted(glob.glob(f"{folder}/*.pt")):
        dump = torch.load(path)
        rows[(dump["graph"], dump["whose"])].extend(iterations(dump))
    keys = ["tasks", "fetched", "pickup", "notice spread", "sched spread", "in group",
            "load", "load max", "wait", "wait max", "spread"]
    lines = ["| graph | side | iterations | " + " | ".join(keys) + " |",
             "|" + "---|" * (len(keys) + 3)]
    for (graph, whose), rs in sorted(rows.items()):
        cells = [st.median(r[k] for r in rs) for k in keys]
        lines.append(f"| {graph} | {whose} | {len(rs)} | " +
                     " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "patch":
        patch(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "parse":
        print(parse(sys.argv[2]))
    else:
        sys.exit(__doc__)
