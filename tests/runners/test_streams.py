"""The bandwidth node's blocked streams (runners/streams.cu): they compile as the node
compiles them, export the launcher it loads, keep their non-caching loads and evict-first
stores, and are an input of the bandwidth node, so an edit re-measures."""
import json
import re
import subprocess

import pytest

from conftest import REPO
from mpkbuild.runners import bandwidth


@pytest.mark.nvcc
def test_the_streams_build_as_the_node_builds_them(tmp_path):
    lib = tmp_path / "libstreams.so"
    subprocess.run(["nvcc", "-O3", "-gencode=arch=compute_90,code=sm_90", "-shared", "-Xcompiler",
                    "-fPIC", "-o", str(lib), str(bandwidth.STREAMS_SOURCE)], check=True, timeout=300)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert re.search(r" T mpkb_stream$", symbols, re.M)
    ptx = tmp_path / "s.ptx"
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-ptx", "-o", str(ptx), str(bandwidth.STREAMS_SOURCE)],
                   check=True, timeout=300)
    text = ptx.read_text()
    entries = re.findall(r"\.entry (\S+)\(", text)
    # registers: 3 mixes x 2 depths x plain / evict-first stores; the ring: read at 3 depths,
    # copy at 3 depths x the two store hints
    assert len(entries) == 3 * 2 * 2 + 3 + 3 * 2
    assert "cp.async.cg.shared.global" in text
    # the 8-deep read kernel keeps its 8 loads in flight (unrolled, none folded away)
    assert max(len(re.findall(r"ld\.global\.nc\.L1::no_allocate\.v4\.u32", body))
               for body in re.split(r"\.entry ", text)[1:]) >= 16     # 2:1's 8 + 8
    assert "st.global.cs.v4.u32" in text


def test_the_streams_are_an_input_of_the_bandwidth_node(built_project):
    status = json.loads(built_project.scons("status", "--json").stdout)
    node = next(n for n in status["nodes"] if n["label"].startswith("bandwidth "))
    assert not node["will_run"]
    src = built_project.path("site_scons/mpkbuild/runners/streams.cu")
    src.write_text(src.read_text() + "// edited\n")
    status = json.loads(built_project.scons("status", "--json").stdout)
    stale = {n["label"] for n in status["nodes"] if n["will_run"]}
    assert node["label"] in stale and any(label.startswith("perf ") for label in stale)
    assert (REPO / "site_scons/mpkbuild/runners/streams.cu").read_text() != src.read_text()
