"""The tune stage with the GPU stand-ins: constraints, rejection, caching and staleness, the
ledger, the tuned file used for its GPU profile only, and lever byte-identity (real nvcc)."""
import json
import os
from pathlib import Path

import pytest

from conftest import FAKES, copy_project
from fakes.cpu_perf import cpu_perf as _cpu_perf
from mpkbuild.model.spec import SpecError
from mpkbuild.stages import load_spec
from mpkbuild.stages import tune
from mpkbuild.util import stats
from mpkbuild.util.fsutil import sha256_file
from mpkbuild.util import expr
from mpkbuild.stages import load_kernel

K = "silu_mul_v2"
SPEC = f"specs/{K}.yaml"
GPU = "fake-gpu-sm90"
TUNED = f"tuned/{GPU}/{K}.json"
# two variants: decode_r8 (cols 32/64/128/256 at rpt 8) and the large one (rpt 1..16)
NARROW = ("  space:\n    cols:", "  variants: [decode_r8_i2048, large_*]\n  space:\n    cols:")
ENV = {"FAKE_GPU_TRIAL_US": json.dumps({"decode_r8_i2048,cols=128": 5.0}),
       "FAKE_GPU_TRIAL_FAIL": json.dumps(["cols=32"]),      # validate fails
       "FAKE_NVCC_SPILL": "COLS = 256;"}                     # the resource gate refuses


# The tune section and configs these tests are written against (the catalog's own may move
# on as the kernel is tuned): every decode variant as 64-column slices of every row, the
# large shape as whole rows, and a space of column slices and row blocks.
FIXTURE_TUNE = """tune:
  space:
    cols: [32, 64, 128, 256, 14336]
    rpt: [1, 2, 4, 8, 16]
  constraints:
    # column slices cover every row (rpt = rows); row tasks take whole rows (cols = inter)
    - "cols < inter and rpt == rows or cols == inter and rows >= 4096"
  budget: {candidates: 8, seconds: 600}
  repeats: 15

"""


def tune_project(dest: Path, kernels: tuple[str, ...] = (K,)):
    """The project with silu_mul_v2's spec set to the fixture's tune section and configs."""
    import re
    p = copy_project(dest, kernels=kernels)
    path = p.root / SPEC
    text = path.read_text()
    text, n = re.subn(r"^tune:\n(?:(?:  .*)?\n)*?(?=\S)", FIXTURE_TUNE, text, count=1, flags=re.M)
    assert n == 1, "silu_mul_v2.yaml has no tune section to replace"
    def config(m):
        rows, inter = int(m["rows"]), int(m["inter"])
        tile = (f"cols: 64, rpt: {rows}, vec: 8, loads: 16, lcs: 1, scs: 0" if m["name"].startswith("decode_")
                else f"cols: {inter}, rpt: 1, vec: 8, loads: 16, lcs: 1, scs: 1")
        return f"{m['head']}{tile}{m['tail']}"
    text, n = re.subn(r"(?P<head>    (?P<name>\w+): +\{rows: (?P<rows>\d+), +inter: (?P<inter>\d+), +)"
                      r"cols: [^}]*?(?P<tail>, mb: \d+\})", config, text)
    assert n == 10, f"silu_mul_v2.yaml: {n} variant lines, not 10"
    path.write_text(text)
    return p


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
    root = tune_project(tmp_path / "p", kernels=(K, "linear_v2")).root
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
        assert cand[0].values == {s: binding[s] for s in ("kf", "nt", "stages")}
        assert len(cand) <= data["tune"]["budget"]["candidates"]
        for c in cand:      # each a variant the tiling allows: whole tasks, whole fills
            v = c.values
            assert binding["n"] % v["nt"] == 0 and binding["k"] % (64 * v["kf"]) == 0, (variant, v)


@pytest.mark.parametrize("edit, where", [
    (("    - \"cols < inter and", "    - \"colz < inter and"), "tune.constraints[0]"),
    (("    rpt: [1, 2, 4, 8, 16]", "    rpt: [1, 2]\n    rows_x: [1]"), "tune.space.rows_x"),
    (("    cols: [32,", "    threads: [128]\n    cols: [32,"), "tune.space.threads"),
    (("  space:\n    cols:", "  variants: [nope_*]\n  space:\n    cols:"), "tune.variants[0]"),
])
def test_bad_tune_sections_are_located(tmp_path, edit, where):
    p = tune_project(tmp_path / "p")
    p.edit(SPEC, *edit)
    with pytest.raises(SpecError) as err:
        load_spec(p.root / SPEC, p.root)
    assert where in str(err.value)


def test_interval_and_pick_rules():
    iv = stats.median_interval([1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02])
    assert iv["lo"] == 0.9 and iv["hi"] == 1.1 and iv["confidence"] > 0.95
    # the perf gate's floor widens a ratio's interval: a 0.5% "win" between two captures,
    # with a tight interval of its own, is not one (the old tune interval had no floor)
    a = stats.median_interval([0.995, 0.9952, 0.9948, 0.995, 0.9951, 0.9949, 0.995], floor=stats.CAPTURE_FLOOR)
    b = stats.median_interval([1.0, 1.0002, 0.9998, 1.0, 1.0001, 0.9999, 1.0], floor=stats.CAPTURE_FLOOR)
    assert not stats.below(a, b)
    assert stats.below(stats.median_interval([0.995] * 7), stats.median_interval([1.0] * 7))

    def row(cid, med, current=False, **config):
        return {"cid": cid, "config": config, "current": current, "verdict": "timed",
                "ratio": {"median": med, "lo": med * 0.99, "hi": med * 1.01}}
    spec = row("a", 1.0, True, nt=16, depth=2)
    # within the interval of the spec's: the spec's config stays
    assert tune.winner([spec, row("b", 0.995, nt=32, depth=2)])["cid"] == "a"
    # clearly faster; of two the interval cannot tell apart, the simpler (fewer changes)
    got = tune.winner([spec, row("c", 0.80, nt=32, depth=4), row("d", 0.805, nt=32, depth=2)])
    assert got["cid"] == "d"
    # the baseline moved between two trials: faster by the ratio, slower in time (as seen
    # on an H200) is no win; faster by both is
    def timed(cid, med, us, current=False, **config):
        return {**row(cid, med, current, **config),
                "time_us": {"median": us, "lo": us * 0.998, "hi": us * 1.002}}
    spec_t = timed("s", 1.024, 31.04, True, nt=16, mb=4)
    assert tune.winner([spec_t, timed("drift", 0.978, 31.77, nt=32, mb=4)])["cid"] == "s"
    assert tune.winner([spec_t, timed("real", 0.978, 29.60, nt=32, mb=4)])["cid"] == "real"
    # the spec's first trial was slowed (seen on an H200): its second one, after the other
    # candidates, is as fast as the candidate, so the candidate does not win
    slow_first = {**timed("s", 1.10, 1.46, True, cols=1024, scs=0),
                  "again": timed("s", 0.99, 1.32, True, cols=1024, scs=0)}
    same = timed("c", 0.99, 1.32, cols=1024, scs=1)
    assert tune.winner([slow_first, same])["cid"] == "s"
    assert tune.winner([{**slow_first, "again": {"verdict": "crash"}}, same])["cid"] == "c"
    # a lever is kernel-wide: on only if every variant's winner has it on
    ledger = {"v1": [row("x", 1.0, True, fast=False), row("y", 0.5, fast=True)],
              "v2": [row("z", 1.0, True, fast=False), row("w", 1.0, fast=True)]}
    wins, levers = tune.pick(ledger, ["fast"])
    assert levers == {"fast": False} and wins["v1"]["cid"] == "x"


# ---------------------------------------------------------------- through scons
@pytest.fixture(scope="module")
def tuned_project(tmp_path_factory):
    p = tune_project(tmp_path_factory.mktemp("tune") / "proj")
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
    assert record["variants"]["large_r4096_i14336"]["vs_spec"] == 1.0
    rows = {tuple(sorted(e["config"].items())): e for e in record["ledger"]["decode_r8_i2048"]}
    spilled = rows[(("cols", 256), ("rpt", 8))]
    assert spilled["verdict"] == "rejected" and "spills" in spilled["message"]
    failed = rows[(("cols", 32), ("rpt", 8))]
    assert failed["verdict"] == "rejected" and failed["message"].startswith("validate")
    assert "ratio" not in spilled and "ratio" not in failed
    lost = rows[(("cols", 64), ("rpt", 8))]
    assert lost["verdict"] == "timed" and lost["vs_winner"] == pytest.approx(2.0, rel=0.01)
    # 4 + 5 candidates; the spilling one never reached the GPU; each variant's spec config
    # again, after every other trial of its variant
    assert trials_run(p) == 10
    for variant in ("decode_r8_i2048", "large_r4096_i14336"):
        lines = [line for line in run.stdout.splitlines() if f"trial {K} {variant} " in line]
        assert len(lines) == 5 and "(again)" in lines[-1] and "cols=64 rpt=8" in lines[-1] \
            if variant.startswith("decode") else "(again)" in lines[-1], lines
        spec_row = next(e for e in record["ledger"][variant] if e["current"])
        assert spec_row["again"]["verdict"] == "timed" and "ratio" in spec_row["again"]
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


def test_review_names_a_tuned_file_made_from_other_inputs_stale(tuned_project, tmp_path):
    """A committed tuned file whose inputs have changed since (here its body) is applied as
    committed, but the review says stale and why, never its recorded pass."""
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    record = json.loads(q.path(TUNED).read_text())
    assert record["verdict"] == "pass"
    record["key"]["body"] = "0" * 64
    q.path(TUNED).write_text(json.dumps(record))
    q.scons("-j2", "stage=review", "kernel=silu_mul_v2", env=stand_in_env())
    md = q.path(f"build/{K}/review.md").read_text()
    assert "## tune (fake-gpu-sm90): stale" in md and "## tune (fake-gpu-sm90): pass" not in md
    assert "the body source changed" in md and "Recorded: pass" in md
    assert "cols=128 rpt=8 (tuned)" in md          # its picks are still the ones applied


def test_a_spec_edit_of_a_tuned_variant_wins_over_the_committed_pick(tuned_project, tmp_path):
    """A user who edits a tuned variant's values gets them built, not the pick the tune made
    from the values before: status predicts it, the review says which pick is not applied and
    why, and the variants left as they were keep their picks."""
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    record = json.loads(q.path(TUNED).read_text())
    assert record["variants"]["decode_r8_i2048"]["spec"] == {"cols": 64, "rpt": 8}
    line = next(l for l in q.path(SPEC).read_text().splitlines() if l.startswith("    decode_r8_i2048:"))
    q.edit(SPEC, line, line.replace("cols: 64,", "cols: 32,"))
    reasons = json.loads(q.scons("status", "--json", "stage=generate").stdout)
    spec_reasons = next(n["reasons"] for n in reasons["nodes"] if n["label"] == f"spec {K}")
    assert any("decode_r8_i2048" in r for r in spec_reasons), spec_reasons
    q.scons("-j2", "stage=review", "kernel=silu_mul_v2", env=stand_in_env())
    section = json.loads(q.path(f"build/{K}/spec/codegen.json").read_text())
    assert section["codegen"]["variants"]["decode_r8_i2048"]["cols"] == 32
    md = q.path(f"build/{K}/review.md").read_text()
    assert "## tune (fake-gpu-sm90): stale" in md
    assert "decode_r8_i2048: the tuned cols=128 rpt=8 is not applied**: the spec's values changed " \
           "since the tune (cols 64 -> 32)" in md, md
    tune_part = md.split("## tune (fake-gpu-sm90)")[1]
    row = next(l for l in tune_part.splitlines() if l.startswith("| decode_r8_i2048 |"))
    assert row.startswith("| decode_r8_i2048 | cols=32 rpt=8 | cols=64 rpt=8 |"), row
    # the edit is undone: the pick applies again, byte for byte the tuned build
    q.edit(SPEC, line.replace("cols: 64,", "cols: 32,"), line)
    q.scons("-j2", "stage=generate", "kernel=silu_mul_v2", env=stand_in_env())
    section = json.loads(q.path(f"build/{K}/spec/codegen.json").read_text())
    assert section["codegen"]["variants"]["decode_r8_i2048"]["cols"] == 128


def test_review_re_renders_a_tuned_file_stale_when_only_the_tune_section_changes(tuned_project, tmp_path):
    """The review reads what the tuned file's key signs: an edit of the tune section alone
    (no gate re-runs) re-renders it, stale."""
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    q.scons("-j2", "stage=review", "kernel=silu_mul_v2", env=stand_in_env())
    assert "## tune (fake-gpu-sm90): pass" in q.path(f"build/{K}/review.md").read_text()
    q.edit(SPEC, "  budget: {candidates: 8, seconds: 600}", "  budget: {candidates: 8, seconds: 601}")
    q.scons("-j2", "stage=review", "kernel=silu_mul_v2", env=stand_in_env())
    md = q.path(f"build/{K}/review.md").read_text()
    assert "## tune (fake-gpu-sm90): stale" in md and "spec section tune" in md


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
    new = [label for label in reasons if label.startswith("trial ") and " again " not in label]
    assert len(new) == 1 and reasons[new[0]] == ["never run"]
    # and the spec's config is timed again after it (it is compared with the new one)
    again_label = next(label for label in reasons if " again " in label)
    assert "decode_r8_i2048" in again_label and any("new source" in r or "trial.json" in r
                                                    for r in reasons[again_label]), reasons[again_label]
    q.scons("-j2", "stage=tune", env=stand_in_env())
    assert trials_run(q) == before + 2
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


def test_a_tool_template_edit_re_runs_the_trials_and_makes_the_tuned_file_stale(tuned_project, tmp_path):
    """A tool upgrade that changes a template the candidates are rendered from (here the
    harness) re-compiles every candidate, and the tuned file made before it is stale, naming
    the template, in status and in the review, until the tune runs again."""
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    harness = "site_scons/mpkbuild/templates/harness.cu.j2"
    q.path(harness).write_text(q.path(harness).read_text() + "// a newer tool\n")
    reasons = stale(q, env=stand_in_env())
    compiles = [label for label in reasons if label.startswith("tunecc ")]
    assert len(compiles) == 9 and all(f"{harness} changed" in reasons[c] for c in compiles), reasons
    assert any("the tool's templates changed (harness.cu.j2)" in r for r in reasons[f"tune {K} {GPU}"])
    q.scons("-j2", "stage=review", "kernel=silu_mul_v2", env=stand_in_env())
    md = q.path(f"build/{K}/review.md").read_text()
    assert "## tune (fake-gpu-sm90): stale" in md and "the tool's templates changed (harness.cu.j2)" in md
    q.scons("-j2", "stage=tune", env=stand_in_env())
    assert not [label for label in stale(q, env=stand_in_env()) if label.startswith(("tunecc ", "tune "))]
    assert json.loads(q.path(TUNED).read_text())["verdict"] == "pass"


def test_the_tune_key_signs_the_pipeline_templates_of_a_pipeline_kernel(tmp_path, monkeypatch):
    """linear_v2's candidates include the warp-role pipeline's helpers in their spec header:
    its key signs those templates (and the megakernel's, its figure being the runtime's), so
    an edit of one names it; an old tuned file without them is stale, saying so."""
    import shutil
    from mpkbuild.util import config
    root = copy_project(tmp_path / "p", kernels=("linear_v2",)).root
    k = load_kernel(root, "linear_v2", write_cache=False)
    before = tune.tune_key(k, None)
    assert {"pipeline_roles.h.j2", "pipeline_ring.h.j2", "megakernel.cu.j2"} <= set(before["templates"])
    templates = tmp_path / "templates"
    shutil.copytree(config.TEMPLATE_DIR, templates)
    (templates / "pipeline_roles.h.j2").write_text((templates / "pipeline_roles.h.j2").read_text() + "{# edited #}\n")
    monkeypatch.setattr(config, "TEMPLATE_DIR", templates)
    assert tune.key_changes(before, tune.tune_key(k, None)) == ["the tool's templates changed (pipeline_roles.h.j2)"]
    old = {f: v for f, v in before.items() if f != "templates"}
    assert "it was made before its key signed the tool's templates" in tune.key_changes(old, before)


def test_trials_need_a_gpu_of_the_profile(tuned_project, tmp_path):
    from conftest import clone_built
    q = clone_built(tuned_project[0], tmp_path / "q")
    q.edit(SPEC, "    rpt: [1, 2, 4, 8, 16]", "    rpt: [1, 2, 4, 8, 16, 32]")
    run = q.scons("stage=tune", fake_gpu=False, check=False, env=stand_in_env())
    assert run.returncode != 0
    assert "tunecc silu_mul_v2" in run.stdout           # candidates compile on the CPU


# ---------------------------------------------------------------- what a trial times
def test_a_trial_times_its_figure_against_the_primary_baseline_only(tmp_path, monkeypatch):
    """The perf runner's `only_figure` (what runners/trial.py asks for): one figure, the
    kernel paired with the primary baseline; the spec's other baseline (silu_mul_v2's
    torch.compile one) is never loaded or compiled, no slowCTA. Without it, the perf gate's
    full set is timed, from the same functions."""
    torch = pytest.importorskip("torch")
    root = tune_project(tmp_path / "p").root
    data = load_spec(root / SPEC, root).data
    assert data["perf"]["baselines"] and data["perf"]["cold"], "the spec this test relies on changed"
    cand = tune.space(data)["decode_r8_i2048"]["candidates"][0]
    # the perf gate's section, extra baselines and all: the option alone keeps them out
    from mpkbuild.util.expr import variant_facts
    codegen = tune.candidate_section(data, cand)
    job = {"root": str(root), "codegen": codegen, "variants": variant_facts(codegen["codegen"], data["perf"]),
           "generators": {"generators": data["generators"]}, "perf": {"perf": data["perf"]}}
    bandwidth = {"copy_bandwidth_Bps": 4.0e12}

    perf, harness, seen = _cpu_perf(monkeypatch, torch)
    hot = perf.perf_variant(harness, job, cand.variant, bandwidth, 1 << 20, only_figure="hot")
    assert seen == {"loaded": [data["perf"]["baseline"]], "compiled": [], "slowcta": 0,
                    "timed": [{"graphs": 2, "prime": True}]}
    assert set(hot["baselines"]) == {"torch"} and set(hot["baselines"]["torch"]) >= {"hot", "vs_hot"}
    assert "hot" in hot and "baseline_hot" in hot and "vs_baseline_hot" in hot
    assert not any(key.startswith(("cold", "baseline_cold", "vs_baseline_cold")) for key in hot)
    assert "slowcta" not in hot and "cold" not in hot["baselines"]["torch"]

    perf, harness, seen = _cpu_perf(monkeypatch, torch)
    cold = perf.perf_variant(harness, job, cand.variant, bandwidth, 1 << 20, only_figure="cold")
    assert seen["timed"] == [{"graphs": 2, "prime": False}] and seen["slowcta"] == 0
    assert "cold" in cold and "baseline_cold" in cold and "hot" not in cold and "baseline_hot" not in cold

    # the perf gate: every baseline, both figures, slowCTA
    perf, harness, seen = _cpu_perf(monkeypatch, torch)
    full = perf.perf_variant(harness, job, cand.variant, bandwidth, 1 << 20)
    n = len(data["perf"]["baselines"])        # compile and autotune, each compiled
    assert len(seen["loaded"]) == 1 + n and len(seen["compiled"]) == n and seen["slowcta"] == 1
    # hot once per placement (the spec's default 3), then cold
    assert seen["timed"] == [{"graphs": 2 + n, "prime": True}] * 3 + [{"graphs": 2 + n, "prime": False}]
    assert [e["placement"] for e in full["hot_placements"]["placements"]] == ["fresh", "after_free", "held"]
    assert {"hot", "cold", "slowcta", "baseline_cold"} <= set(full) and \
        set(full["baselines"]) == {"torch", *(b["name"] for b in data["perf"]["baselines"])}

    # the trial runner asks perf for the tune's figure
    from mpkbuild.runners import trial
    asked = []
    monkeypatch.setattr(trial.validate, "main", lambda job: {"verdict": "pass", "variants": {}})
    monkeypatch.setattr(trial.perf, "main", lambda job, only_figure=None: asked.append(only_figure) or {})
    assert trial.main({**job, "figure": "cold"})["verdict"] == "timed" and asked == ["cold"]


def test_a_trials_job_holds_what_it_times_and_its_result_no_more(tuned_project):
    p, _ = tuned_project
    results = [json.loads(f.read_text()) for f in p.path(f"build/{K}/gpu/{GPU}").glob("tune/*/trial.json")]
    timed = [r for r in results if r["verdict"] == "timed"]
    assert len(timed) == 7          # 2 + 5: one failed validate, one spilled
    for r in timed:
        assert r["job"]["figure"] == "hot"
        perf = r["job"]["perf"]["perf"]
        assert "baselines" not in perf and "thresholds" not in perf and "cold" not in perf
        assert perf["repeats"] == 15 and perf["baseline"].endswith(":torch_silu_mul")
        fig = r["perf"]["variants"][r["candidate"]["variant"]]
        assert set(fig["baselines"]) == {"torch"} and "cold" not in fig and "baseline_cold" not in fig
        assert r["elapsed_s"] >= 0        # what the budget counts


def _set_budget(p, seconds) -> None:
    import re
    text = p.path(SPEC).read_text()
    new, n = re.subn(r"(budget: \{candidates: \d+, seconds: )[0-9.]+\}", rf"\g<1>{seconds}}}", text)
    assert n == 1, "the tune section's budget line changed shape"
    p.path(SPEC).write_text(new)


def test_the_time_budget_leaves_later_candidates_not_run_until_it_is_larger(tmp_path):
    """Each trial records 10 s (FAKE_GPU_ELAPSED). Budget 25 s: in candidate order (-j1) a
    variant's trials run while the ones before it spent at most 25 s; the rest are `not
    run`, never timed nor lost, not cached (cache= keeps none of them), and re-checked on the
    next call: the same budget runs nothing, a larger one runs exactly them."""
    p = tune_project(tmp_path / "p")
    p.edit(SPEC, *NARROW)
    _set_budget(p, 25)
    env = stand_in_env(FAKE_GPU_ELAPSED=json.dumps({K: 10}))
    cache = tmp_path / "cache"
    run = p.scons("-j1", "stage=tune", f"cache={cache}", env=env)
    order = [line.split()[2] for line in run.stdout.splitlines() if line.startswith("trial ")]
    data = load_spec(p.root / SPEC, p.root).data
    # each variant's candidates in order, then its spec config again (the budget spares it)
    assert order == [cid for e in tune.space(data).values()
                     for cid in [c.cid for c in e["candidates"]] + [e["candidates"][0].cid]]
    record = json.loads(p.path(TUNED).read_text())
    large = record["ledger"]["large_r4096_i14336"]
    assert [e["verdict"] for e in large] == ["timed", "timed", "timed", "not run", "not run"]
    for e in large[3:]:
        assert e["message"].startswith("the variant's time budget (25 s) was spent: 30.0 s by the 3 trials")
        assert not {"ratio", "time_us", "vs_winner"} & set(e)
    # decode_r8: 10 + 10 (validate failed: its GPU time counts) + 10; the spilled one never ran
    assert [e["verdict"] for e in record["ledger"]["decode_r8_i2048"]] == ["timed", "rejected", "timed", "rejected"]
    assert record["verdict"] == "pass" and "2 candidates not run" in record["message"]
    assert record["space"]["large_r4096_i14336"]["not_run"] == 2
    assert "not run: the variant's time budget (25 s) was spent" in run.stdout
    assert trials_run(p) == 8
    cached = [json.loads(f.read_text()) for f in cache.rglob("*") if f.is_file()
              and f.read_bytes().startswith(b"{") and b'"gate": "trial"' in f.read_bytes()]
    assert sorted(r["verdict"] for r in cached) == ["rejected"] * 2 + ["timed"] * 7

    # not a cached result: status says the skipped ones run again, and why
    reasons = {label: why for label, why in stale(p, env=env).items() if not label.startswith("spec ")}
    skipped = {f"trial {K} {e['cid']} {GPU}" for e in large[3:]}
    assert set(reasons) == skipped            # and the pick is not re-run: they change nothing
    assert all("time budget was spent" in r[0] for r in reasons.values())
    # the same budget: they are checked, still not run, and nothing else changes
    before = p.path(TUNED).read_bytes()
    again = p.scons("-j1", "stage=tune", env=env)
    assert trials_run(p) == 8 and f"tune {K} {GPU}" not in again.stdout
    assert p.path(TUNED).read_bytes() == before
    # a larger budget: exactly the two run, and are timed (and the spec's config again after them)
    _set_budget(p, 45)
    p.scons("-j1", "stage=tune", env=env)
    assert trials_run(p) == 11
    record = json.loads(p.path(TUNED).read_text())
    assert [e["verdict"] for e in record["ledger"]["large_r4096_i14336"]] == ["timed"] * 5
    assert "not run" not in record["message"]
    assert not [label for label in stale(p, env=env) if label.startswith(("trial ", "tune "))]


def test_trials_and_the_key_follow_exactly_the_baseline_files_trials_read(tmp_path):
    """With the primary baseline and an extra one in files of their own: the extra one's file
    (and its spec entry, and a threshold) is no trial's input and not in the key; the primary
    baseline's file is both, and the key says which file changed."""
    import yaml
    from mpkbuild.gpu import GpuFingerprint
    from mpkbuild.stages import load_kernel
    p = tune_project(tmp_path / "p")
    p.edit(SPEC, *NARROW)
    ref = p.path(f"kernels/{K}/reference.py").read_text()
    for name in ("primary.py", "extra.py"):
        p.path(f"kernels/{K}/{name}").write_text(ref)
    data = yaml.safe_load(p.path(SPEC).read_text())
    data["perf"]["baseline"] = f"kernels/{K}/primary.py:torch_silu_mul"
    data["perf"]["baselines"] = [{"name": "extra", "function": f"kernels/{K}/extra.py:torch_silu_mul"}]
    data["perf"]["thresholds"] = [t for t in data["perf"]["thresholds"] if "baseline" not in t]
    p.path(SPEC).write_text(yaml.safe_dump(data, sort_keys=False))
    env = stand_in_env()
    p.scons("-j2", "stage=tune", env=env)
    for r in (json.loads(f.read_text()) for f in p.path(f"build/{K}/gpu/{GPU}").glob("tune/*/trial.json")):
        if r["verdict"] == "timed":
            assert f"kernels/{K}/primary.py" in r["job"]["inputs"]
            assert f"kernels/{K}/extra.py" not in r["job"]["inputs"]
            assert f"kernels/{K}/extra.py" not in r["inputs"]     # the node's inputs, as recorded
    fp = GpuFingerprint(name="Fake GPU", compute_capability="9.0", driver="1.0", torch="0.0", count=1)

    def key():
        return tune.tune_key(load_kernel(p.root, K, write_cache=False), fp)

    first = key()
    assert first["baseline"] == {f"kernels/{K}/primary.py": sha256_file(p.path(f"kernels/{K}/primary.py"))}
    assert first == json.loads(p.path(TUNED).read_text())["key"]
    # the extra baseline: its file, its entry, a threshold: no trial re-runs, the key stays
    p.path(f"kernels/{K}/extra.py").write_text(ref + "\n# edited\n")
    data["perf"]["baselines"][0]["compile"] = True
    data["perf"]["thresholds"] = data["perf"]["thresholds"][1:]
    p.path(SPEC).write_text(yaml.safe_dump(data, sort_keys=False))
    assert key() == first
    assert not [label for label in stale(p, env=env) if label.startswith(("trial ", "tune "))]
    # the primary baseline's file: every trial and the key
    p.path(f"kernels/{K}/primary.py").write_text(ref + "\n# edited\n")
    changed = key()
    assert changed["baseline"] != first["baseline"] and changed["reference"] == first["reference"]
    assert tune.key_changes(first, changed) == [f"the torch baseline changed (kernels/{K}/primary.py)"]
    reasons = stale(p, env=env)
    trials = [label for label in reasons if label.startswith("trial ")]
    assert len(trials) == 11 and all(f"kernels/{K}/primary.py changed" in reasons[t] for t in trials)
    assert any(f"the torch baseline changed (kernels/{K}/primary.py)" in r for r in reasons[f"tune {K} {GPU}"])


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


def test_a_tune_on_a_gpu_profile_the_spec_does_not_target_waits_for_its_hardware(project):
    """sm_100a only, on the H200's profile: the tune compiles nothing and runs no trial; status
    and check say it waits (pending TIER-1), never passed, never an error."""
    import json
    project.edit("specs/rmsnorm_v2.yaml", "archs: [sm_90a, sm_100a]", "archs: [sm_100a]")
    project.edit("specs/rmsnorm_v2.yaml", "task_type: {sm_90a: TASK_RMSNORM_V2_HOPPER, sm_100a:", "task_type: {sm_100a:")
    project.edit("specs/rmsnorm_v2.yaml", "number: {sm_90a: auto, sm_100a: auto}", "number: {sm_100a: auto}")
    h200 = "gpu=nvidia-h200-sm90"
    assert not project.scons("-n", "stage=tune", h200).actions
    nodes = {n["label"]: n for n in json.loads(project.scons("status", "--json", "stage=tune", h200).stdout)["nodes"]}
    tune = nodes["tune rmsnorm_v2 nvidia-h200-sm90"]
    assert tune["state"] == "pending" and tune["reasons"][0].startswith("pending TIER-1 (needs sm_100a)")
    assert not [label for label in nodes if label.startswith(("trial ", "tunecc "))]
    check = project.scons("check", "stage=tune", h200)
    assert "pending TIER-1 (needs sm_100a)" in check.stdout


PINNED = Path(__file__).resolve().parents[3] / "shared" / "mirage" / "mpk"


@pytest.mark.skipif(not (PINNED / "src" / "kernel" / "task_register.cc").is_file(),
                    reason="../shared/mirage (the pinned MPK tree) is absent")
def test_a_tune_by_the_in_runtime_figure_picks_what_runs_fastest_inside_mpk(tmp_path):
    """Issue 58 item 3: `tune.figure: runtime` ranks a variant's candidates by ours / the
    incumbent's makespan inside MPK. The harness ranks cols=32 first; inside MPK cols=128 at
    vec 4 wins (3 us against the incumbent's 10, the spec's cols=64 at 6): the tuned file
    takes it, says the runtime figure decided, and keeps each row's harness figure beside it.
    The runtime trial times the spec's configuration, the harness's fastest three and the
    fastest of each task count not among them (vec does not change the count); a candidate
    it did not time is never picked."""
    p = tune_project(tmp_path / "proj")
    p.edit(SPEC, "  space:\n    cols: [32, 64, 128, 256, 14336]",
           "  variants: [decode_r8_i2048]\n  figure: runtime\n  space:\n    cols: [32, 64, 128, 256]\n"
           "    vec: [4, 8]")
    env = stand_in_env(FAKE_GPU_TRIAL_US=json.dumps({"cols=32": 4.0, "cols=256": 5.0, "cols=128,vec=4": 9.0}),
                       FAKE_GPU_TRIAL_FAIL="[]", FAKE_NVCC_SPILL="NO SPILL",
                       FAKE_GPU_INSIDE_US=json.dumps({"cols=128,vec=4": 3.0, "cols=32": 8.0}))
    p.scons("stage=tune", f"kernel={K}", f"mpk_root={PINNED}", env=env)
    tuned = json.loads(p.path(TUNED).read_text())
    assert tuned["figure"] == "runtime" and tuned["harness_figure"] == "hot"
    assert "inside MPK" in tuned["interval"]
    win = tuned["variants"]["decode_r8_i2048"]
    assert win["config"] == {"cols": 128, "rpt": 8, "vec": 4} and win["from"] == "tune"
    assert win["ratio"]["median"] == pytest.approx(0.3, rel=0.02)
    rows = {(r["config"]["cols"], r["config"]["vec"]): r for r in tuned["ledger"]["decode_r8_i2048"] if r.get("cid")}
    assert rows[32, 8]["harness"]["ratio"]["median"] == pytest.approx(0.2, rel=0.02)  # the harness's pick
    assert rows[32, 8]["ratio"]["median"] == pytest.approx(0.8, rel=0.02)
    assert rows[64, 8]["current"] and rows[64, 8]["ratio"]["median"] == pytest.approx(0.6, rel=0.02)
    inside = json.loads(p.path(f"build/{K}/gpu/{GPU}/tune/runtime/runtime_trial.json").read_text())
    timed = {(r["config"]["cols"], r["config"]["vec"]) for r in inside["candidates"].values()}
    # the spec's, the harness's fastest three (cols 32 and 256 at both widths); then every
    # task count not among them once: 16 tasks (cols 128) by its fastest, vec 4
    assert timed == {(64, 8), (32, 8), (32, 4), (256, 8), (128, 4)}
    assert [rows[c]["verdict"] for c in ((128, 8), (64, 4), (256, 4))] == [tune.NOT_INSIDE] * 3
    assert rows[128, 8]["message"] == ("not timed inside MPK: neither among the harness's 3 fastest nor "
                                       "the harness's fastest of its task count")


@pytest.mark.skipif(not (PINNED / "src" / "kernel" / "task_register.cc").is_file(),
                    reason="../shared/mirage (the pinned MPK tree) is absent")
def test_the_runtime_sections_a_tune_inside_mpk_reads_make_it_stale_and_no_other_edit(tmp_path):
    """Timed inside MPK, a tune reads the spec's wiring and its runtime section less the
    blocks and thresholds (each candidate alone against the builder's incumbent): a
    threshold edit re-runs no trial and leaves the tuned file fresh; a `pairs` edit re-runs
    the runtime trial and stales the file, saying which section; a file whose key predates
    those signatures is stale, saying so."""
    p = tune_project(tmp_path / "proj")
    p.edit(SPEC, "  space:\n    cols: [32, 64, 128, 256, 14336]",
           "  variants: [decode_r8_i2048]\n  figure: runtime\n  space:\n    cols: [32, 64]")
    env = stand_in_env(FAKE_GPU_TRIAL_FAIL="[]", FAKE_NVCC_SPILL="NO SPILL",
                       FAKE_GPU_INSIDE_US=json.dumps({"cols=32": 8.0}))
    args = (f"kernel={K}", f"mpk_root={PINNED}")
    p.scons("stage=tune", *args, env=env)
    made = json.loads(p.path(TUNED).read_text())["key"]

    def key():
        return {**tune.tune_key(load_kernel(p.root, K, write_cache=False), None),
                "gpu": made["gpu"], "toolchain": made["toolchain"]}

    assert {"wiring", "runtime"} <= set(made["sections"]) and tune.key_changes(made, key()) == []
    p.edit(SPEC, "max_vs_incumbent: 1.0, figure: makespan}", "max_vs_incumbent: 0.9, figure: makespan}")
    assert tune.key_changes(made, key()) == []
    assert not [label for label in stale(p, *args, env=env) if label.startswith(("trial ", "tune "))]
    p.edit(SPEC, "  pairs: 20\n", "  pairs: 24\n")
    assert tune.key_changes(made, key()) == ["spec section runtime changed"]
    reasons = stale(p, *args, env=env)
    assert [label for label in reasons if label.startswith("trial ")] == [f"trial {K} runtime {GPU}"]
    assert f"tune {K} {GPU}" in reasons
    older = {**made, "sections": {s: v for s, v in made["sections"].items() if s not in ("wiring", "runtime")}}
    assert tune.key_changes(older, key())[0] == \
        "it was made before its key signed the spec's wiring and runtime sections"


def test_the_runtime_trial_times_every_task_count_even_the_harnesss_last(tmp_path):
    """What a task costs the runtime (its dispatch, a start spread growing with the task
    count: bench/RESULTS.md section 31) is what the harness cannot see: past the harness's
    fastest three, the runtime trial times the fastest of each task count not yet among them
    (up to three more), so fewer, fuller tasks that the harness ranks last can win inside MPK
    (rmsnorm_v2 decode_r8 on the H100: 2 rows a task, 0.59x MPK against one row's 0.99x)."""
    p = tune_project(tmp_path / "proj")
    p.edit(SPEC, "  space:\n    cols: [32, 64, 128, 256, 14336]",
           "  variants: [decode_r8_i2048]\n  figure: runtime\n  space:\n    cols: [32, 64, 128, 256, 512, 1024]")
    # the harness: the more tasks the faster; inside MPK two tasks (cols 1024) beat them all
    env = stand_in_env(FAKE_GPU_TRIAL_US=json.dumps({"cols=32": 4.0, "cols=64": 5.0, "cols=128": 6.0,
                                                     "cols=256": 7.0, "cols=512": 8.0, "cols=1024": 9.0}),
                       FAKE_GPU_TRIAL_FAIL="[]", FAKE_NVCC_SPILL="NO SPILL",
                       FAKE_GPU_INSIDE_US=json.dumps({"cols=1024": 2.0, "cols=512": 4.0}))
    p.scons("stage=tune", f"kernel={K}", f"mpk_root={PINNED}", env=env)
    inside = json.loads(p.path(f"build/{K}/gpu/{GPU}/tune/runtime/runtime_trial.json").read_text())
    assert sorted(r["config"]["cols"] for r in inside["candidates"].values()) == [32, 64, 128, 256, 512, 1024]
    tuned = json.loads(p.path(TUNED).read_text())
    win = tuned["variants"]["decode_r8_i2048"]
    assert win["config"] == {"cols": 1024, "rpt": 8} and win["from"] == "tune"
    assert win["ratio"]["median"] == pytest.approx(0.2, rel=0.02)
