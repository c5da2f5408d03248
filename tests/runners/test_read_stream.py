"""The bandwidth node's read-only stream (runners/read_stream.cu): it compiles as the
runner compiles it, exports the launcher the runner loads, keeps its loads (non-caching,
eight in flight), and is an input of the bandwidth node, so an edit re-measures."""
import shutil
import subprocess

import pytest

from conftest import REPO
from mpkbuild.runners import bandwidth


@pytest.mark.nvcc
def test_the_read_stream_builds_as_the_runner_builds_it(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    lib = tmp_path / "libread_stream.so"
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib),
                    str(bandwidth.STREAM_SOURCE)], check=True, timeout=300)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert " T mpkb_read_stream" in symbols
    ptx = tmp_path / "s.ptx"
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-ptx", "-o", str(ptx), str(bandwidth.STREAM_SOURCE)],
                   check=True, timeout=300)
    assert ptx.read_text().count("ld.global.nc.L1::no_allocate") >= 8    # the unrolled loads


def test_the_read_stream_is_an_input_of_the_bandwidth_node(built_project):
    import json
    status = json.loads(built_project.scons("status", "--json").stdout)
    node = next(n for n in status["nodes"] if n["label"].startswith("bandwidth "))
    assert not node["will_run"]
    src = built_project.path("site_scons/mpkbuild/runners/read_stream.cu")
    src.write_text(src.read_text() + "// edited\n")
    status = json.loads(built_project.scons("status", "--json").stdout)
    stale = {n["label"] for n in status["nodes"] if n["will_run"]}
    assert node["label"] in stale and any(label.startswith("perf ") for label in stale)
    assert (REPO / "site_scons/mpkbuild/runners/read_stream.cu").read_text() != src.read_text()
