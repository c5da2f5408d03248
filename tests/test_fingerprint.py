"""What compile's fingerprint covers, and the dry run staying exact where a spec edit
changes no rendered file (issue 29)."""
import json

import pytest

pytestmark = pytest.mark.nvcc

K = "rmsnorm_v2"
SPEC = f"specs/{K}.yaml"


def status_nodes(p, env=None):
    run = p.scons("status", "--json", "stage=review", env=env)
    return {n["label"]: n for n in json.loads(run.stdout)["nodes"]}


def dry_run_set(p, env=None):
    return set(p.scons("-n", "stage=review", env=env).stdout.split("\n")) - {""}


def test_render_neutral_codegen_edit_predicts_no_compile(built):
    # family is in the codegen section but in no template: every generated file keeps its bytes
    built.edit(SPEC, "family: B", "family: C")
    predicted = dry_run_set(built)
    stale = {label for label, n in status_nodes(built).items() if n["will_run"]}
    assert f"generate {K} harness.cu" in predicted
    assert not any(label.startswith("compile") for label in predicted), sorted(predicted)
    assert predicted == stale
    executed = set(built.scons("stage=review").actions)
    assert executed == predicted, f"dry run {sorted(predicted)} != executed {sorted(executed)}"


@pytest.mark.parametrize("variable", ["NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"])
def test_nvcc_environment_flags_are_in_the_compile_fingerprint(built, variable):
    env = {variable: "-DMPK_FINGERPRINT_TEST=1"}
    nodes = status_nodes(built, env)
    compile_node = nodes[f"compile {K} sm_90a"]
    assert compile_node["will_run"]
    reason = compile_node["reasons"][0]
    assert reason.startswith("nvcc 13.") and f"with {variable}=-DMPK_FINGERPRINT_TEST=1" in reason, reason
    predicted = dry_run_set(built, env)
    assert {f"compile {K} sm_90a", f"compile {K} sm_100a"} <= predicted
    executed = set(built.scons("stage=review", env=env).actions)
    assert executed == predicted
    assert dry_run_set(built, env) == set()            # fresh under the same flags
    assert f"compile {K} sm_90a" in dry_run_set(built)  # and stale again without them


def test_a_bad_flag_in_the_environment_fails_the_compile_it_reaches(built):
    run = built.scons("stage=compile", env={"NVCC_APPEND_FLAGS": "--no-such-nvcc-flag"}, check=False)
    assert run.returncode != 0 and "no-such-nvcc-flag" in run.stdout + run.stderr


def test_the_host_compiler_is_in_the_compile_fingerprint(built, tmp_path):
    """nvcc's host compiler (NVCC_CCBIN, else the gcc on PATH) builds the host side and tells
    the device front end its version: another one makes compile stale, named in the reason,
    and the build under it is fresh after (issue 59 item 9: a build on another machine is
    never taken for this one's)."""
    import os
    import shutil
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("gcc", "g++"):       # nvcc compiles with one and links with the other
        wrapper = folder / tool
        wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "{tool} (wrapped for a test) '
                           f'0.0.1"; exit 0; fi\nexec {shutil.which(tool)} "$@"\n')
        wrapper.chmod(0o755)
    env = {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}
    compile_node = status_nodes(built, env)[f"compile {K} sm_90a"]
    assert compile_node["will_run"]
    assert "host gcc (wrapped for a test) 0.0.1" in compile_node["reasons"][0], compile_node["reasons"]
    predicted = dry_run_set(built, env)
    assert {f"compile {K} sm_90a", f"compile {K} sm_100a"} <= predicted
    assert set(built.scons("stage=review", env=env).actions) == predicted
    assert dry_run_set(built, env) == set()
    assert f"compile {K} sm_90a" in dry_run_set(built)
    assert os.environ.get("NVCC_CCBIN") is None
