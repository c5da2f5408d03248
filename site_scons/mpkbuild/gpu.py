"""GPU fingerprints: the facts that give a GPU gate's verdict its meaning.

Read with nvidia-smi (fast: importing torch costs seconds and would tax every scons run).
The fingerprint is a dependency of every GPU gate, so moving to another GPU makes the GPU
gates stale and nothing else; its key names the folder where that GPU's results live, so
results for two GPUs sit side by side.

At module level this file imports the standard library only: executor=dask ships its source
to workers that need not have mpkbuild (run/remote/dask.py), so what the profile functions
need of the package is imported inside them.
"""
from __future__ import annotations

import functools
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


NO_GPU_HELP = (
    "the {stage} gate needs a CUDA GPU and this machine has none ({why}). "
    "Run it on the GPU box: copy the tree there and run `scons kernel={kernel} stage={stage}{args}`; "
    "here, build up to `stage=compile` (and `stage=wire`). Nothing was marked passed.")


def _torch_version() -> str:
    """torch's version from its installed metadata, read without importing torch (seconds)
    or importlib.metadata (~20 ms of imports on every scons run)."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    for folder in spec.submodule_search_locations:
        try:
            text = open(os.path.join(folder, "version.py")).read()
        except OSError:
            continue
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if found:
            return found.group(1)
    import importlib.metadata
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


SMI_FIELDS = ("index", "uuid", "name", "compute_cap", "driver_version")
SMI_TIMEOUT_S = 30.0


def parse_smi(text: str) -> tuple[dict, ...]:
    """Rows of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader` (here or from a
    remote host): a name may hold commas, so it is everything between the uuid and the
    last two fields."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < len(SMI_FIELDS) or not cells[0].isdigit():
            continue
        rows.append({"index": int(cells[0]), "uuid": cells[1], "name": ", ".join(cells[2:len(cells) - 2]),
                     "compute_cap": cells[-2], "driver_version": cells[-1]})
    return tuple(rows)


@functools.lru_cache(maxsize=None)
def smi_rows() -> tuple[dict, ...]:
    """Every GPU nvidia-smi lists on this machine, one query per process (each call costs
    tens of ms, more on a box whose GPUs are not kept initialised). Empty without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    cmd = [smi, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return ()
    if proc.returncode != 0:
        return ()
    return parse_smi(proc.stdout)


@functools.lru_cache(maxsize=None)
def detect() -> GpuFingerprint | None:
    """The first visible GPU's fingerprint, or None when there is no usable GPU."""
    rows = list(smi_rows())
    if not rows:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        if all(w.isdigit() for w in wanted):
            rows = [r for r in rows if str(r["index"]) in wanted]
        if not rows:
            return None
    first = rows[0]
    same = sum(1 for r in rows if r["name"] == first["name"])
    return GpuFingerprint(name=first["name"], compute_capability=first["compute_cap"],
                          driver=first["driver_version"], torch=_torch_version(), count=same)


def describe_absence() -> str:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    return "nvidia-smi lists no GPU"


class ProfileError(Exception):
    """gpu=<profile> names no known GPU profile."""


def profile_files(root) -> dict[str, "Path"]:
    """Every committed GPU profile by key: the package's (shipped with it), then the project's
    gpu_profiles/ (the same key there wins)."""
    from pathlib import Path
    from mpkbuild.util import config
    out = {p.stem: p for p in config.SHIPPED_PROFILES.glob("*.json")}
    out.update({p.stem: p for p in (Path(root) / config.PROFILE_DIRNAME).glob("*.json")})
    return out


def load_profile(root, key: str) -> GpuFingerprint:
    """A GPU profile by key: a committed one (the project's gpu_profiles/<key>.json, else the
    package's), else the fingerprint a run on that GPU recorded under build/ (bandwidth or any
    gate result)."""
    from pathlib import Path
    import json
    from mpkbuild.util import config
    root = Path(root)
    build = root / config.BUILD_DIRNAME
    committed = profile_files(root)
    candidates = [committed[key]] if key in committed else []
    candidates += [build / "gpu" / key / "bandwidth.json", *sorted(build.glob(f"*/gpu/{key}/*.json"))]
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
    known = sorted(set(committed) | {p.parent.name for p in build.glob("gpu/*/bandwidth.json")})
    raise ProfileError(f"gpu={key}: no such GPU profile (known: {', '.join(known) or 'none'}; "
                       f"save one on the GPU box with `python -m mpkbuild.gpu > {config.PROFILE_DIRNAME}/<key>.json`)")


def profiles_with_results(root) -> list[str]:
    """The GPU profiles some gate result in build/ was made for (a committed profile with
    none is not one: status must not say results exist where there are none)."""
    from pathlib import Path
    from mpkbuild.util import config
    return sorted({p.parent.name for p in (Path(root) / config.BUILD_DIRNAME).glob("*/gpu/*/validate.json")})


if __name__ == "__main__":
    import json
    import sys
    fp = detect()
    if fp is None:
        sys.exit(f"no GPU here ({describe_absence()})")
    json.dump(fp.to_json(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
