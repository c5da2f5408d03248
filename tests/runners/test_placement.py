"""The perf gate's hot figure over buffer placements (issue 42), on the CPU: a stand-in
timer whose kernel runs slower when its buffers are not where the first placement put them
(cuBLAS-like baselines do not move) must be caught, judged on the worst placement, paired
within its placement, and shown by the review."""
import pytest

from conftest import REPO
from fakes.cpu_perf import cpu_perf
from mpkbuild.stages import load_spec
from mpkbuild.runners import placement
from mpkbuild.stages.perf import judge, report

K = "rmsnorm_v2"
VARIANT = "decode_r8_h4096"
SLOW = 1.3


def _job(placements=None):
    data = load_spec(REPO / "specs" / f"{K}.yaml", REPO).data
    perf = dict(data["perf"], cold=False)
    if placements is not None:
        perf["placements"] = placements
    from mpkbuild.runners import facts
    from mpkbuild.util.expr import variant_facts
    return {"root": str(REPO), "codegen": {"codegen": data["codegen"]},
            "generators": {"generators": data["generators"]}, "perf": {"perf": perf},
            facts.KEY: variant_facts(data["codegen"], perf)}


def _placement_sensitive_timer():
    """The kernel (graph 0) takes SLOW x as long whenever its input is not at the address
    the first timing saw; every baseline takes 1.0 wherever it is."""
    seen_ptrs, first = [], []

    def launch(inputs, outputs, spans=None, stream=None):
        seen_ptrs.append(inputs[0].data_ptr())

    def time_graphs(graphs, launches, repeats, warmup, prime=False, sampling=None, nvml=None):
        seen_ptrs.clear()
        for enqueue in graphs:
            enqueue(1, None)
        ptr = seen_ptrs[0]
        first.append(first[0] if first else ptr)
        kernel_us = 1.0 if ptr == first[0] else SLOW
        n = 21
        out = []
        for i in range(len(graphs)):
            us = kernel_us if i == 0 else 1.0
            samples = [us * (1 + 0.001 * ((j * 7 + i) % 5 - 2)) for j in range(n)]
            out.append({"median_us": sorted(samples)[n // 2], "samples_us": samples})
        return out
    return launch, time_graphs


def test_the_schedule_is_fresh_then_after_a_free_then_beside_a_held_buffer():
    assert [p.name for p in placement.schedule(3)] == ["fresh", "after_free", "held"]
    assert [p.name for p in placement.schedule(1)] == ["fresh"]
    with pytest.raises(ValueError):
        placement.schedule(0)
    h200_l2 = 60 * 2**20
    assert placement.sensitive(28 * 2**20, h200_l2)           # linear_v2 m8 n7168 k2048
    assert not placement.sensitive(460 * 2**10, h200_l2)      # rmsnorm_v2 r16 h7168
    assert not placement.sensitive(352 * 2**20, h200_l2)      # silu_mul_v2 large


def test_a_placement_effect_is_caught_and_judged_on_the_worst(monkeypatch):
    torch = pytest.importorskip("torch")
    launch, timer = _placement_sensitive_timer()
    perf, harness, _ = cpu_perf(monkeypatch, torch, time_graphs=timer, launch=launch)
    bandwidth = {"copy_bandwidth_Bps": 4.0e12}
    r = perf.perf_variant(harness, _job(), VARIANT, bandwidth, 1 << 20)
    entries = r["hot_placements"]["placements"]
    assert [e["placement"] for e in entries] == ["fresh", "after_free", "held"]
    assert [round(e["kernel"]["median_us"], 2) for e in entries] == [1.0, SLOW, SLOW]
    assert r["hot"]["placement"] != "fresh" and r["hot"]["median_us"] == pytest.approx(SLOW, rel=0.01)
    for name, b in r["baselines"].items():          # each paired within its own placement
        assert b["hot"]["placement"] != "fresh", name
        assert b["vs_hot"]["ratio"] == pytest.approx(SLOW, rel=0.01) and b["vs_hot"]["verdict"] == "slower"
    assert r["vs_baseline_hot"] == pytest.approx(SLOW, rel=0.01)
    # the build's judge pairs the same way: a 1.1x limit fails on the worst placement
    result = {"verdict": "timed", "variants": {VARIANT: r}}
    rule = [{"variants": "*", "max_time_vs_baseline": 1.1}]
    judged = judge.judge(result, rule, [VARIANT])
    assert judged["verdict"] == "fail" and "1.30x the baseline's" in judged["message"], judged["message"]
    assert judged["variants"][VARIANT]["vs"]["torch"]["hot"]["verdict"] == "slower"
    # the review shows every placement, the spread and the judged one
    (row,) = report.placement_rows(judged)
    assert row["judged"] == r["hot"]["placement"] and row["spread"] == pytest.approx(SLOW, rel=0.01)
    assert [e["placement"] for e in row["entries"]] == ["fresh", "after_free", "held"]


def test_one_placement_alone_would_have_passed_it(monkeypatch):
    """What the gate said before placements: the fresh placement only, the effect unseen."""
    torch = pytest.importorskip("torch")
    launch, timer = _placement_sensitive_timer()
    perf, harness, _ = cpu_perf(monkeypatch, torch, time_graphs=timer, launch=launch)
    r = perf.perf_variant(harness, _job(placements=1), VARIANT, {"copy_bandwidth_Bps": 4.0e12}, 1 << 20)
    assert [e["placement"] for e in r["hot_placements"]["placements"]] == ["fresh"]
    judged = judge.judge({"verdict": "timed", "variants": {VARIANT: r}},
                         [{"variants": "*", "max_time_vs_baseline": 1.1}], [VARIANT])
    assert judged["verdict"] == "pass"


def test_the_review_page_shows_each_placement_and_flags_a_working_set_near_the_l2(monkeypatch, tmp_path):
    import json
    from mpkbuild.stages import review
    torch = pytest.importorskip("torch")
    launch, timer = _placement_sensitive_timer()
    perf, harness, _ = cpu_perf(monkeypatch, torch, time_graphs=timer, launch=launch)
    # an L2 of 64 KiB: the 136 KiB the launch moves (perf.bytes) is within the factor: flagged
    r = perf.perf_variant(harness, _job(), VARIANT, {"copy_bandwidth_Bps": 4.0e12}, 1 << 16)
    assert r["hot_placements"]["sensitive"]
    judged = judge.judge({"verdict": "timed", "variants": {VARIANT: r}}, [], [VARIANT])
    path = tmp_path / "perf.json"
    path.write_text(json.dumps(judged))
    page = review.render_kernel(review.kernel_review(K, tmp_path, [], "h200", {}, {"perf": path}))
    assert "### Hot over buffer placements" in page and "worst of placements" in page
    row = next(ln for ln in page.splitlines() if ln.startswith(f"| {VARIANT} **placement-sensitive** |"))
    assert "1.300×" in row and f"| {r['hot']['placement']} |" in row
