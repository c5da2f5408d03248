"""A foreign body (issue 41): a kernel whose body wraps the pinned tree's own Hopper RMSNorm
task (tasks/hopper/rmsnorm_hopper.cuh), found through the spec's `codegen.include_dirs`. It
compiles, and an edit of the included real header (or of one it includes) makes the compile
stale in -n, status, why= and the build alike; nothing else makes it stale."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_project

MIRAGE = REPO.parent / "shared" / "mirage"
K = "rms_incumbent"

pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(not MIRAGE.is_dir(), reason=f"{MIRAGE} is absent (the pinned "
                                 "Mirage trees are only on machines that carry ../shared)")]

BODY = """#pragma once
// MPK's own Hopper RMSNorm task in the body contract (the incumbent of rmsnorm_v2)
#include "tasks/common/copy_sm80.cuh"   // what MPK's task header includes before it
#include "tasks/hopper/rmsnorm_hopper.cuh"
template <int HIDDEN>
__device__ __forceinline__ void rms_incumbent_task(__nv_bfloat16 const *input,
                                                   __nv_bfloat16 const *weight,
                                                   __nv_bfloat16 *output, int task_index,
                                                   char *smem) {
  kernel::rms_norm_hopper_impl<type::bfloat16_t, 1, HIDDEN, rms_incumbent_spec::THREADS>(
      input, weight, output, rms_incumbent_spec::EPS);
}
"""


@pytest.fixture
def foreign(tmp_path):
    project = copy_project(tmp_path / "proj", kernels=("rmsnorm_v2",))
    mpk = tmp_path / "mpk"
    shutil.copytree(MIRAGE / "mpk" / "include", mpk / "include")
    spec = yaml.safe_load((REPO / "specs" / "rmsnorm_v2.yaml").read_text())
    spec.update(kernel=K, archs=["sm_90a"])
    for section in ("wiring", "tune"):
        spec.pop(section, None)
    cg = spec["codegen"]
    cg.pop("levers", None)
    # MPK's task takes the hidden size alone: one row a task
    cg.update(body=f"kernels/{K}/{K}.cuh", variants={"decode_r1_h4096": {"rows": 1, "hidden": 4096}},
              template_params=["hidden"], grid=["rows"],
              tiling=[t for t in cg["tiling"] if t["symbol"] != "rows"],
              include_dirs=[str(mpk / "include/mirage/persistent_kernel")])
    spec["perf"]["thresholds"] = []
    spec["runtime"]["thresholds"] = [t for t in spec["runtime"]["thresholds"] if t["variants"] == "*"]
    (project.root / "specs" / f"{K}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    kdir = project.root / "kernels" / K
    kdir.mkdir()
    shutil.copy2(project.root / "kernels/rmsnorm_v2/reference.py", kdir / "reference.py")
    (kdir / f"{K}.cuh").write_text(BODY)
    project.scons(f"kernel={K}", "stage=compile")
    return project, mpk / "include/mirage/persistent_kernel"


def stale(project) -> dict[str, list[str]]:
    run = project.scons("status", "--json", f"kernel={K}", "stage=compile")
    return {n["label"]: n["reasons"] for n in json.loads(run.stdout)["nodes"] if n["will_run"]}


@pytest.mark.parametrize("header", ["tasks/hopper/rmsnorm_hopper.cuh", "tasks/common/worker_config.h"])
def test_an_edit_of_an_included_real_header_is_seen_by_all_four(foreign, header):
    project, pk = foreign
    compile_ = f"compile {K} sm_90a"
    assert stale(project) == {}
    assert project.scons("-n", f"kernel={K}", "stage=compile").stdout.split() == []
    path = pk / header
    path.write_text(path.read_text() + "\n// edited\n")
    assert stale(project) == {compile_: [f"{path} changed"]}
    assert set(project.scons("-n", f"kernel={K}", "stage=compile").stdout.splitlines()) == {compile_}
    why = project.scons(f"kernel={K}", f"why={path}").stdout
    assert f"  {compile_}\n" in why
    assert compile_ in project.scons(f"kernel={K}", "stage=compile").actions
    assert stale(project) == {}


def test_a_header_outside_the_include_folders_is_not_an_input(foreign):
    """cuda_bf16.h and the other toolkit headers are the toolchain's (its fact); a header of
    the checkout the body never reaches is nothing to it."""
    project, pk = foreign
    other = pk / "tasks/hopper/linear_hopper.cuh"
    other.write_text(other.read_text() + "\n// edited\n")
    assert stale(project) == {}
    assert project.scons(f"kernel={K}", "stage=compile").actions == []
