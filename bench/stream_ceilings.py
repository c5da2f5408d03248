"""This GPU's bandwidth ceilings per read:write mix, as the bandwidth node measures them
(site_scons/mpkbuild/runners/bandwidth.py): torch's streams against the blocked streams of
runners/streams.cu over their span, threads, loads in flight and store hint.

    PYTHONPATH=site_scons python bench/stream_ceilings.py [--out DIR]

Prints, per mix, torch's streams and the fastest blocked shapes in TB/s (bytes read +
written per launch over the median of 9 samples, each 3 launches queued behind an untimed
one, with the slowest and fastest sample in brackets), then the ceiling each mix gets and
by how much it exceeds torch's; with --out the node's whole result as JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mpkbuild.runners import bandwidth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = bandwidth.main({})
    print(f"{torch.cuda.get_device_name()}: {result['streams']}")
    for mix in ("read", "1:1", "2:1"):
        rows = {name.split(": ", 1)[1]: t for name, t in result["timings"].items() if name.startswith(f"{mix}: ")}
        tbps = {name: t["bytes"] / t["median_us"] / 1e6 for name, t in rows.items()}
        order = sorted(tbps, key=tbps.get)
        torch_best = max(v for n, v in tbps.items() if n.startswith("torch"))
        print(f"\n{mix}: {next(iter(rows.values()))['bytes'] / 2**30:.1f} GiB moved per launch")
        for name in [n for n in order if n.startswith("torch")] + order[-5:]:
            t = rows[name]
            print(f"  {name:<40} {tbps[name]:.3f} TB/s  [{t['bytes'] / t['max_us'] / 1e6:.3f}, "
                  f"{t['bytes'] / t['min_us'] / 1e6:.3f}]")
        print(f"  ceiling {result['ceilings_Bps'][mix] / 1e12:.3f} TB/s ({result['ceiling_streams'][mix]}), "
              f"{result['ceilings_Bps'][mix] / 1e12 / torch_best:.3f}x torch's best")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bandwidth.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
