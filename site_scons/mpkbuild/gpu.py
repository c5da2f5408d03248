"""GPU fingerprints: the facts that give a GPU gate's verdict its meaning.

Read with nvidia-smi (fast: importing torch costs seconds and would tax every scons run).
The fingerprint is a dependency of every GPU gate, so moving to another GPU makes the GPU
gates stale and nothing else; its key names the folder where that GPU's results live, so
results for two GPUs sit side by side.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuFingerprint:
    name: str                 # "NVIDIA H200"
    compute_capability: str   # "9.0"
    driver: str               # "580.159.04"
    torch: str                # "2.11.0+cu130"
    count: int                # visible GPUs of this model

    @property
    def key(self) -> str:
        """Folder name for this GPU's results: model and compute capability."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return f"{slug}-sm{self.compute_capability.replace('.', '')}"

    @property
    def cc(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    def signature(self) -> str:
        """What a GPU gate's result depends on: model, CC, driver major, torch major.minor."""
        torch_mm = ".".join(self.torch.split("+")[0].split(".")[:2])
        return (f"gpu={self.name}; cc={self.compute_capability}; "
                f"driver={self.driver.split('.')[0]}; torch={torch_mm}")

    def to_json(self) -> dict:
        return asdict(self)


class NoGpuError(Exception):
    """No usable CUDA GPU on this machine."""


NO_GPU_HELP = (
    "GPU gates (validate, perf) need a CUDA GPU and this machine has none ({why}). "
    "Run them on the GPU box: copy the tree there and run `scons kernel={kernel} stage={stage}`; "
    "here, build up to `stage=compile`. Nothing was marked passed.")


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=None)
def detect() -> GpuFingerprint | None:
    """The first visible GPU's fingerprint, or None when there is no usable GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cmd = [smi, "--query-gpu=index,name,compute_cap,driver_version", "--format=csv,noheader"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not rows:
        return None
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        rows = [r for r in rows if r[0] in wanted] if all(w.isdigit() for w in wanted) else rows
        if not rows:
            return None
    first = rows[0]
    same = sum(1 for r in rows if r[1] == first[1])
    return GpuFingerprint(name=first[1], compute_capability=first[2], driver=first[3],
                          torch=_torch_version(), count=same)


def describe_absence() -> str:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    return "nvidia-smi lists no GPU"


PROFILE_DIR = "gpu_profiles"


class ProfileError(Exception):
    """gpu=<profile> names no known GPU profile."""


def load_profile(root, key: str) -> GpuFingerprint:
    """A GPU profile by key: gpu_profiles/<key>.json (committed), else the fingerprint a
    run on that GPU recorded under build/ (bandwidth or any gate result)."""
    from pathlib import Path
    import json
    root = Path(root)
    candidates = [root / PROFILE_DIR / f"{key}.json", root / "build" / "gpu" / key / "bandwidth.json"]
    candidates += sorted(root.glob(f"build/*/gpu/{key}/*.json"))
    for path in candidates:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        data = data.get("gpu", data)
        try:
            fp = GpuFingerprint(**{k: data[k] for k in ("name", "compute_capability", "driver", "torch", "count")})
        except (KeyError, TypeError):
            continue
        if fp.key == key:
            return fp
    known = sorted({p.stem for p in (root / PROFILE_DIR).glob("*.json")}
                   | {p.parent.name for p in root.glob("build/gpu/*/bandwidth.json")})
    raise ProfileError(f"gpu={key}: no such GPU profile (known: {', '.join(known) or 'none'}; "
                       f"save one on the GPU box with `python -m mpkbuild.gpu > {PROFILE_DIR}/<key>.json`)")


def known_profiles(root) -> list[str]:
    from pathlib import Path
    root = Path(root)
    return sorted({p.stem for p in (root / PROFILE_DIR).glob("*.json")}
                  | {p.parent.name for p in root.glob("build/*/gpu/*/validate.json")})


if __name__ == "__main__":
    import json
    import sys
    fp = detect()
    if fp is None:
        sys.exit(f"no GPU here ({describe_absence()})")
    json.dump(fp.to_json(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
