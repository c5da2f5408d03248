"""The tune stage with the GPU stand-ins: constraints, rejection, caching and staleness, the
ledger, the tuned file used for its GPU profile only, and lever byte-identity (real nvcc)."""
import json
import os
from pathlib import Path

import pytest

from conftest import FAKES, copy_project
from mpkbuild.model.spec import SpecError, load_spec
from mpkbuild.stages import interval, tune
from mpkbuild.util import expr

K = "silu_mul_v2"
SPEC = f"specs/{K}.yaml"
GPU = "fake-gpu-sm90"
TUNED = f"tuned/{GPU}/{K}.json"
# two variants: decode_r8 (cols 32/64/128/256 at rpt 8) and the large one (rpt 1..16)
NARROW = ("  space:\n    cols:", "  variants: [decode_r8_i2048, large_*]\n  space:\n    cols:")
ENV = {"FAKE_GPU_TRIAL_US": json.dumps({"decode_r8_i2048,cols=128": 5.0}),
       "FAKE_GPU_TRIAL_FAIL": json.dumps(["cols=32"]),      # validate fails
       "FAKE_NVCC_SPILL": "COLS = 256;"}                     # the resource gate refuses


def stand_in_env(**extra):
    return {"PATH": f"{FAKES / 'nvcc_bin'}{os.pathsep}{os.environ['PATH']}", **ENV, **extra}


def trials_run(p) -> int:
    return sum(1 for line in p.runs_file.read_text().splitlines() if line.startswith("trial ")) \
        if p.runs_file.exists() else 0


def stale(p, *args, env=None):
    out = json.loads(p.scons("status", "--json", "stage=tune", *args, env=env).stdout)
    return {n["label"]: n["reasons"] for n in out["nodes"] if n["will_run"]}


# ---------------------------------------------------------------- the space, no build
def test_conditions_compare_expressions():
    s = {"n": 64, "nt": 16, "tc": 1, "depth": 8}
    assert expr.holds("n % nt == 0 and 1 <= depth <= 8", s)
    assert not expr.holds("tc == 0 or depth * nt <= 64", s)
    assert expr.holds("not (tc == 0)", s)
    for bad in ("nt", "nt + 1", "nt < unknown"):
        with pytest.raises(expr.ExprError):
            expr.holds(bad, s)


def test_space_has_the_spec_config_first_meets_constraints_and_budget(tmp_path):
    root = copy_project(tmp_path / "p", kernels=(K, "linear_v2")).root
    sp = tune.space(load_spec(root / SPEC, root).data)
    for variant, entry in sp.items():
        first = entry["candidates"][0]
        assert first.current
        for cand in entry["candidates"]:
            v = cand.values
            if variant.startswith("decode"):
                assert v["rpt"] == int(variant.split("_r")[1].split("_")[0]) and v["cols"] < 14336
        assert entry["excluded_by_constraints"] > 0
    # linear_v2's space holds every configuration committed by hand, each its variant's first
    data = load_spec(root / "specs/linear_v2.yaml", root).data
    lsp = tune.space(data)
    for variant, binding in data["codegen"]["variants"].items():
        cand = lsp[variant]["candidates"]
        assert cand[0].values == {s: binding[s] for s in ("depth", "mb", "nt", "tc")}
        assert len(cand) <= data["tune"]["budget"]["candidates"]
        for c in cand:
            v = c.values
            assert v["tc"] == 1 or v["depth"] * v["nt"] // 4 <= 16


@pytest.mark.parametrize("edit, where", [
    (("    - \"cols < inter and", "    - \"colz < inter and"), "tune.constraints[0]"),
    (("    rpt: [1, 2, 4, 8, 16]", "    rpt: [1, 2]\n    rows_x: [1]"), "tune.space.rows_x"),
    (("    cols: [32,", "    threads: [128]\n    cols: [32,"), "tune.space.threads"),
    (("  space:\n    cols:", "  variants: [nope_*]\n  space:\n    cols:"), "tune.variants[0]"),
])
def test_bad_tune_sections_are_located(tmp_path, edit, where):
    p = copy_project(tmp_path / "p", kernels=(K,))
    p.edit(SPEC, *edit)
    with pytest.raises(SpecError) as err:
        load_spec(p.root / SPEC, p.root)
    assert where in str(err.value)


def test_interval_and_pick_rules():
    iv = interval.median_interval([1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02])
    assert iv["lo"] == 0.9 and iv["hi"] == 1.1 and iv["confidence"] > 0.95

    def row(cid, med, current=False, **config):
        return {"cid": cid, "config": config, "current": current, "verdict": "timed",
                "ratio": {"median": med, "lo": med * 0.99, "hi": med * 1.01}}
    spec = row("a", 1.0, True, nt=16, depth=2)
    # within the interval of the spec's: the spec's config stays
    assert tune.winner([spec, row("b", 0.995, nt=32, depth=2)])["cid"] == "a"
    # clearly faster; of two the interval cannot tell apart, the simpler (fewer changes)
    got = tune.winner([spec, row("c", 0.80, nt=32, depth=4), row("d", 0.805, nt=32, depth=2)])
    assert got["cid"] == "d"
    # a lever is kernel-wide: on only if every variant's winner has it on
    ledger = {"v1": [row("x", 1.0, True, fast=False), row("y", 0.5, fast=True)],
              "v2": [row("z", 1.0, True, fast=False), row("w", 1.0, fast=True)]}
    wins, levers = tune.pick(ledger, ["fast"])
    assert levers == {"fast": False} and wins["v1"]["cid"] == "x"


# ---------------------------------------------------------------- through scons
@pytest.fixture(scope="module")
def tuned_project(tmp_path_factory):
    p = copy_project(tmp_path_factory.mktemp("tune") / "proj", kernels=(K,))
    p.edit(SPEC, *NARROW)
    run = p.scons("-j2", "stage=tune", env=stand_in_env())
    return p, run


def test_tune_rejects_failing_candidates_and_times_the_rest(tuned_project):
    p, run = tuned_project
    record = json.loads(p.path(TUNED).read_text())
    assert record["verdict"] == "pass" and record["gpu_profile"] == GPU
    # the fastest the interval says is faster won; the large variant keeps the spec's config
    assert record["variants"]["decode_r8_i2048"]["config"] == {"cols": 128, "rpt": 8}
    assert record["variants"]["decode_r8_i2048"]["from"] == "tune"
    assert record["variants"]["large_r4096_i14336"]["from"] == "spec"
    rows = {tuple(sorted(e["config"].items())): e for e in record["ledger"]["decode_r8_i2048"]}
    spilled = rows[(("cols", 256), ("rpt", 8))]
    assert spilled["verdict"] == "rejected" and "spills" in spilled["message"]
    failed = rows[(("cols", 32), ("rpt", 8))]
    assert failed["verdict"] == "rejected" and failed["message"].startswith("validate")
    assert "ratio" not in spilled and "ratio" not in failed
    lost = rows[(("cols", 64), ("rpt", 8))]
    assert lost["verdict"] == "timed" and lost["vs_winner"] == pytest.approx(2.0, rel=0.01)
    # 4 + 5 candidates; the spilling one never reached the GPU
    assert trials_run(p) == 8
    assert "tune silu_mul_v2 decode_r8_i2048: cols=128 rpt=8 (tune)" in run.stdout


def test_tuned_file_drives_that_profiles_build_only(tuned_project, tmp_path):
    p, _ = tuned_project
    from conftest import clone_built
    q = clone_built(p, tmp_path / "q")
    # the first build after a tune: the spec node says why the codegen it writes changed
    reasons = json.loads(q.scons("status", "--json", "stage=generate").stdout)
    spec_reasons = next(n["reasons"] for n in reasons["nodes"] if n["label"] == f"spec {K}")
    assert any("tuned config" in r for r in spec_reasons), spec_reasons
    q.scons("stage=generate", env=stand_in_env())
    header = q.path(f"build/{K}/gen/{K}_spec.h").read_text()
    section = json.loads(q.path(f"build/{K}/spec/codegen.json").read_text())
    assert section["codegen"]["variants"]["decode_r8_i2048"]["cols"] == 128
    assert section["codegen"]["variants"]["decode_r16_i2048"]["cols"] == 64     # not tuned
    # another GPU profile: the spec's values
    q.path("gpu_profiles").mkdir(exist_ok=True)
    q.path("gpu_profiles/other-gpu-sm90.json").write_text(json.dumps(
        {"name": "Other GPU", "compute_capability": "9.0", "driver": "1.0", "torch": "0.0", "count": 1}))
    other = q.scons("stage=generate", "gpu=other-gpu-sm90", env=stand_in_env())
    assert "spec silu_mul_v2" in other.stdout
    section = json.loads(q.path(f"build/{K}/spec/codegen.json").read_text())
    assert section["codegen"]["variants"]["decode_r8_i2048"]["cols"] == 64
    assert header != q.path(f"build/{K}/gen/{K}_spec.h").read_text()


def test_review_lists_what_won_and_lost(tuned_project, tmp_path):
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    q.scons("-j2", "stage=review", "kernel=silu_mul_v2", env=stand_in_env())
    md = q.path(f"build/{K}/review.md").read_text()
    assert "## tune (fake-gpu-sm90): pass" in md
    assert "cols=128 rpt=8 (tuned)" in md and "cols=64 rpt=8, +100.0%" in md
    assert "spills" in md


def test_cached_a_lost_candidate_is_not_timed_again_and_staleness_says_why(tuned_project, tmp_path):
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    before = trials_run(q)
    again = q.scons("-j2", "stage=tune", env=stand_in_env())
    assert trials_run(q) == before and "trial " not in again.stdout
    assert stale(q, env=stand_in_env()) == {}
    # a wider space: only the new candidates are tried; the losers keep their numbers
    q.edit(SPEC, "    cols: [32, 64, 128, 256, 14336]", "    cols: [16, 32, 64, 128, 256, 14336]")
    reasons = stale(q, env=stand_in_env())
    assert any("tune.space.cols" in r for r in reasons[f"tune {K} {GPU}"])
    new = [label for label in reasons if label.startswith("trial ")]
    assert len(new) == 1 and reasons[new[0]] == ["never run"]
    q.scons("-j2", "stage=tune", env=stand_in_env())
    assert trials_run(q) == before + 1
    # the body: every candidate is rebuilt (and re-timed, its library changed)
    q.edit(f"kernels/{K}/{K}.cuh.j2", "#pragma once", "#pragma once\n// edited")
    reasons = stale(q, env=stand_in_env())
    assert any(f"kernels/{K}/{K}.cuh.j2 changed" in r for r in reasons[f"tune {K} {GPU}"])
    trial = next(label for label in reasons if label.startswith("trial "))
    assert any(r.startswith("upstream tunecc") for r in reasons[trial])
    # a tuned file made from other inputs (another clone, an old commit) is named stale
    q.scons("-j2", "stage=tune", env=stand_in_env())
    record = json.loads(q.path(TUNED).read_text())
    record["key"]["toolchain"] = "toolchain: nvcc 12.0 (old); flags: x"
    record["key"]["body"] = "0" * 64
    q.path(TUNED).write_text(json.dumps(record))
    why = stale(q, env=stand_in_env())[f"tune {K} {GPU}"]
    assert any("tuned from other inputs" in r and "body source changed" in r and "nvcc 12.0" in r
               for r in why), why


def test_trials_need_a_gpu_of_the_profile(tuned_project, tmp_path):
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    q.edit(SPEC, "    rpt: [1, 2, 4, 8, 16]", "    rpt: [1, 2, 4, 8, 16, 32]")
    run = q.scons("stage=tune", fake_gpu=False, check=False, env=stand_in_env())
    assert run.returncode != 0
    assert "tunecc silu_mul_v2" in run.stdout           # candidates compile on the CPU


# ---------------------------------------------------------------- levers
@pytest.mark.nvcc
def test_a_lever_that_is_off_changes_no_byte(tmp_path):
    """rmsnorm_v2's plain_stores lever: the build without it (no `levers`, the body's
    default branch only) and with it off are byte-identical (generated files, libraries);
    compile does not even run. On, the body differs."""
    p = copy_project(tmp_path / "p", kernels=("rmsnorm_v2",))
    spec, body = "specs/rmsnorm_v2.yaml", "kernels/rmsnorm_v2/rmsnorm_v2.cuh.j2"
    p.edit(spec, "archs: [sm_90a, sm_100a]", "archs: [sm_90a]")     # one nvcc run per build
    p.edit(spec, ", sm_100a: TASK_RMSNORM_V2_SM100}", "}")
    p.edit(spec, ", sm_100a: auto}", "}")
    with_lever = (p.path(spec).read_text(), p.path(body).read_text())
    text = with_lever[0]
    start = text.index("  # default-off switches")
    end = text.index("  # variant symbols passed")
    tune_start, tune_end = text.index("# scons stage=tune"), text.index("# random input distributions")
    p.path(spec).write_text(text[:start] + text[end:tune_start] + text[tune_end:])
    b = with_lever[1]
    i = b.index("{% if levers.plain_stores %}")
    j = b.index("{% else %}\n", i) + len("{% else %}\n")
    k = b.index("{% endif %}\n", j)
    p.path(body).write_text(b[:i] + b[j:k] + b[k + len("{% endif %}\n"):])
    assert "levers" not in p.path(body).read_text() and "levers" not in p.path(spec).read_text()

    def outputs():
        gen = {f.name: f.read_bytes() for f in sorted(p.path("build/rmsnorm_v2/gen").iterdir())}
        res = json.loads(p.path("build/rmsnorm_v2/sm_90a/resources.json").read_text())
        return gen, res["library_sha256"], p.path("build/rmsnorm_v2/sm_90a/librmsnorm_v2.so").read_bytes()

    p.scons("stage=compile", fake_gpu=False)
    without = outputs()
    p.path(spec).write_text(with_lever[0])
    p.path(body).write_text(with_lever[1])
    run = p.scons("stage=compile", fake_gpu=False)
    assert "compile rmsnorm_v2 sm_90a" not in run.stdout      # nothing generated changed
    assert outputs() == without
    p.edit(spec, "plain_stores: {default: false", "plain_stores: {default: true")
    run = p.scons("stage=compile", fake_gpu=False)
    assert "compile rmsnorm_v2 sm_90a" in run.stdout
    assert outputs()[0][f"rmsnorm_v2.cuh"] != without[0]["rmsnorm_v2.cuh"]
