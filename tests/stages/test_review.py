"""The review page says where a kernel does not beat torch, with the numbers and the limit
the spec holds it to; every perf figure shows the rules it was judged by."""
import json

from mpkbuild.stages import review
from mpkbuild.stages.perf.judge import judge, limits_by_variant
from mpkbuild.stages.perf.report import bandwidth_marks, dram_figures


def figures(hot, base_hot, cold=None, base_cold=None, bw=0.9):
    r = {"hot": {"median_us": hot}, "baseline_hot": {"median_us": base_hot},
         "slowcta": {"slowest_task_us": hot / 2}, "vs_baseline_hot": hot / base_hot,
         "hot_bandwidth_fraction": bw}
    if cold is not None:
        r.update(cold={"median_us": cold}, baseline_cold={"median_us": base_cold},
                 vs_baseline_cold=cold / base_cold, cold_bandwidth_fraction=bw)
    return r


def check_thresholds(variants: dict, rules: list) -> list[str]:
    """The failures perf's judge finds in these figures under these rules."""
    import copy
    return judge({"verdict": "timed", "variants": copy.deepcopy(variants)}, rules, list(variants))["problems"]


VARIANTS = {"decode_m16_n7168_k2048": figures(7.48, 6.58, 10.33, 10.21),
            "decode_m1_n4096_k4096": figures(6.54, 10.32, 9.9, 11.0),
            "large_m1_n28672_k8192": figures(104.8, 119.0, 105.1, 120.4, bw=1.04)}
RULES = [{"variants": "large_*", "min_bandwidth_fraction": 0.85},
         {"variants": "decode_m1_*", "max_time_vs_baseline": 1.0},
         {"variants": "decode_m16_n7168_k2048", "max_time_vs_baseline": 1.2}]


def test_each_variant_records_the_rules_that_judge_it():
    limits = limits_by_variant(VARIANTS, RULES)
    assert limits["decode_m16_n7168_k2048"] == [RULES[2]]
    assert limits["large_m1_n28672_k8192"] == [RULES[0]]
    assert check_thresholds(VARIANTS, RULES) == []
    tight = RULES[:2] + [{"variants": "decode_m16_*", "max_time_vs_baseline": 1.1}]
    (problem,) = check_thresholds(VARIANTS, tight)
    assert problem.startswith("decode_m16_n7168_k2048: 7.48 us is 1.14x the baseline's 6.58 us (limit 1.1x)")


def test_the_review_lists_what_is_slower_than_torch_with_its_numbers_and_limit(tmp_path):
    variants = {k: dict(v, limits=limits_by_variant(VARIANTS, RULES)[k]) for k, v in VARIANTS.items()}
    perf = tmp_path / "gpu" / "h200" / "perf.json"
    perf.parent.mkdir(parents=True)
    perf.write_text(json.dumps({"verdict": "pass", "message": "all thresholds met",
                                "copy_bandwidth_Bps": 4.2e12, "variants": variants}))
    page = review.render_kernel(review.kernel_review("linear_v2", tmp_path, [], "h200", {}, {"perf": perf}))
    assert "**Slower than torch**" in page
    line = next(ln for ln in page.splitlines() if ln.startswith("- decode_m16_n7168_k2048"))
    assert line == ("- decode_m16_n7168_k2048: 7.48 µs vs torch 6.58 µs (1.14×); cold 10.33 vs "
                    "10.21 µs (1.01×); held to ≤ 1.2× by `decode_m16_n7168_k2048`")
    assert not any(ln.startswith("- decode_m1_") for ln in page.splitlines())
    row = next(ln for ln in page.splitlines() if ln.startswith("| large_m1_n28672_k8192 |"))
    assert row.endswith("| ≥ 85% BW |")
    # 104% of a DRAM ceiling, hot (its working set is not known to fit the L2) and cold: the
    # ceiling is not one, and the row says so; 90% says nothing
    assert row.count("104% (above the ceiling)") == 2
    assert "above the ceiling" not in next(ln for ln in page.splitlines()
                                           if ln.startswith("| decode_m16_n7168_k2048 |"))


def test_a_review_with_every_variant_faster_says_so_and_one_without_limits_says_that(tmp_path):
    perf = tmp_path / "perf.json"
    fast = {"decode_m1_n4096_k4096": dict(VARIANTS["decode_m1_n4096_k4096"], limits=[])}
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": fast}))
    page = review.render_kernel(review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf}))
    assert "Every variant at or below torch's time (hot)." in page and "Slower than torch" not in page
    slow = {"decode_x": dict(figures(2.0, 1.0), limits=[])}
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": slow}))
    page = review.render_kernel(review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf}))
    assert "- decode_x: 2.00 µs vs torch 1.00 µs (2.00×); no time limit in the spec" in page


def test_the_summary_names_each_kernels_variants_slower_than_torch(tmp_path):
    pages = []
    for name, variants in (("linear_v2", VARIANTS), ("fast", {"decode_a": figures(1.0, 2.0)})):
        perf = tmp_path / name / "perf.json"
        perf.parent.mkdir()
        perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": variants}))
        page = tmp_path / name / "review.json"
        review.write_kernel_review(review.kernel_review(name, tmp_path / name, [], "h200", {}, {"perf": perf}),
                                   tmp_path / name / "review.md", page)
        pages.append(page)
    none_run = tmp_path / "new" / "review.json"
    none_run.parent.mkdir()
    review.write_kernel_review(review.kernel_review("new", tmp_path / "new", [], "h200", {},
                                                    {"perf": tmp_path / "new" / "perf.json"}),
                               tmp_path / "new" / "review.md", none_run)
    review.write_summary(pages + [none_run], tmp_path / "review.md")
    lines = [ln for ln in (tmp_path / "review.md").read_text().splitlines() if ln.startswith("| ") and "---" not in ln]
    head = [c.strip() for c in lines[0].split("|")]
    assert head[1:5] == ["kernel", "overall", "compile", "perf"]      # a column per gate the reviews have
    col = head.index("slower than torch")
    rows = {ln.split("|")[1].strip(): ln.split("|")[col].strip() for ln in lines[1:]}
    assert rows["linear_v2"] == "decode_m16_n7168_k2048 1.14×"
    assert rows["fast"] == "" and rows["new"] == "—"


def test_a_shared_perf_gate_says_which_gpus_timed_its_variants(tmp_path):
    perf = tmp_path / "perf.json"
    variants = {k: dict(v, gpu_index=i % 2) for i, (k, v) in enumerate(VARIANTS.items())}
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": variants,
                                "shared": [{"gpu_index": 0, "variants": ["a", "b"]},
                                           {"gpu_index": 1, "variants": ["c"]}]}))
    page = review.render_kernel(review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf}))
    assert "Variants shared over GPUs (each timed whole on one): GPU 0 (2), GPU 1 (1)." in page
    # a runner that started as the last variant was claimed timed nothing: not "shared"
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": variants,
                                "shared": [{"gpu_index": 0, "variants": ["a", "b", "c"]},
                                           {"gpu_index": 1, "variants": []}]}))
    page = review.render_kernel(review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf}))
    assert "Variants shared over GPUs" not in page


def test_a_time_limit_on_the_cold_figure_judges_cold_and_the_review_says_so(tmp_path):
    """A working set over twice the L2: the hot figure is one buffer set's placement (bimodal
    on the H200s for linear_v2 m16 n14336_k4096), the cold one the rotation's."""
    bimodal = {"decode_m16_n14336_k4096": figures(33.97, 30.33, 31.51, 30.99)}
    on_hot = [{"variants": "decode_m16_*", "max_time_vs_baseline": 1.05}]
    on_cold = [dict(on_hot[0], time_figure="cold")]
    (problem,) = check_thresholds(bimodal, on_hot)
    assert problem.startswith("decode_m16_n14336_k4096: 33.97 us is 1.12x")
    assert check_thresholds(bimodal, on_cold) == []
    slower = {"decode_m16_n14336_k4096": figures(33.97, 30.33, 33.0, 30.99)}
    (problem,) = check_thresholds(slower, on_cold)
    assert problem.startswith("decode_m16_n14336_k4096: cold 33.00 us is 1.06x the baseline's 30.99 us")
    hot_only = {"decode_x": figures(1.0, 2.0)}
    (problem,) = check_thresholds(hot_only, [{"variants": "*", "max_us": 5, "time_figure": "cold"}])
    assert "no cold figure" in problem
    variants = {k: dict(v, limits=limits_by_variant(bimodal, on_cold)[k]) for k, v in bimodal.items()}
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": variants}))
    page = review.render_kernel(review.kernel_review("linear_v2", tmp_path, [], "h200", {}, {"perf": perf}))
    line = next(ln for ln in page.splitlines() if ln.startswith("- decode_m16_n14336_k4096"))
    assert line.endswith("held to ≤ 1.05× (cold) by `decode_m16_*`")
    assert "≤ 1.05× torch (cold)" in page


def test_the_runtime_gate_shows_in_runtime_beside_the_harness_and_flags_beyond_noise(tmp_path):
    """Per graph: in-runtime slowCTA (median, range over iterations) and median task beside
    the harness's slowCTA (perf.json, range over repeats); flagged only when the ranges are
    disjoint, not judged without a range, a block graph has no harness figure."""
    perf = tmp_path / "perf.json"
    slow = lambda med, lo, hi: dict(figures(2.0, 2.5), limits=[],
                                    slowcta={"slowest_task_us": med, "slowest_range_us": [lo, hi]})
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": {
        "decode": slow(0.80, 0.78, 0.85), "large": slow(1.50, 1.45, 1.60),
        "old": dict(figures(2.0, 2.5), limits=[], slowcta={"slowest_task_us": 1.0})}}))
    span = lambda per_it, med: {"verdict": "pass", "tasks": 8, "iterations": len(per_it),
                                "spans": {"slowest_task_us": sorted(per_it)[len(per_it) // 2],
                                          "median_us": med, "per_iteration_slowest_us": per_it}}
    rt = tmp_path / "runtime.json"
    rt.write_text(json.dumps({"verdict": "pass", "message": "all pass",
                              "grid": {"workers": 128, "schedulers": 16}, "variants": {
        "decode": span([0.83, 0.84, 0.82], 0.74), "large": span([2.37, 2.41, 2.35], 1.34),
        "old": span([1.1, 1.2, 1.0], 0.9), "block:mlp:b8": span([9.2, 9.3, 9.28], 8.42)}}))
    r = review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf, "runtime": rt})
    flags = {x["variant"]: x["flag"] for x in r["parts"]["runtime"]["table"]}
    assert flags == {"decode": "within noise", "large": "runtime slower", "old": "not judged",
                     "block:mlp:b8": "block (no harness figure)"}
    page = review.render_kernel(r)
    assert "## runtime: pass" in page and "128 workers, 16 schedulers" in page
    row = next(ln for ln in page.splitlines() if ln.startswith("| large | pass"))
    assert row == ("| large | pass | 8 × 3 | 2.37 [2.35, 2.41] | 1.34 | 1.50 [1.45, 1.60] | 1.58× "
                   "| **runtime slower** |")
    assert "ranges do not overlap" in page


def test_the_review_leads_with_the_in_runtime_verdict_against_the_incumbent(tmp_path):
    """The runtime gate's judged head to head comes first on the page: per variant and
    incumbent the makespans with their intervals, the ratio and its word, the numerics
    against the incumbent, the harness's comparison beside it (flagged where it points the
    other way), and a variant without an incumbent says why."""
    from mpkbuild.stages.runtime import judge
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps({"verdict": "pass", "message": "ok", "variants": {
        "decode": dict(figures(3.0, 2.5), limits=[])}}))
    launches = lambda us: {"makespan_us": [us * (1 + 0.001 * i) for i in range(20)],
                           "slowcta_us": [us / 2] * 20}
    rt = {"verdict": "pass", "message": "all pass", "grid": {"workers": 128, "schedulers": 16},
          "variants": {
              "decode": {"verdict": "pass", "tasks": 8, "head_to_head": {
                  "pairs": 20, "ours": launches(5.0),
                  "incumbents": {"rmsnorm_hopper": {"tasks": 8, **launches(6.25), "numerics": {
                      "output": {"ours_vs_incumbent": {"cos": 0.9999, "rel": 0.002}}}}}}},
              "large": {"verdict": "pass", "tasks": 64,
                        "no_incumbent": [{"incumbent": "linear_swapAB_hopper", "why": "TMA descriptors"}]}}}
    rt = judge.judge(rt, [{"variants": "decode", "max_vs_incumbent": 1.0, "figure": "makespan"}],
                     ["decode", "large"])
    (tmp_path / "runtime.json").write_text(json.dumps(rt))
    r = review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf, "runtime": tmp_path / "runtime.json"})
    page = review.render_kernel(r)
    assert page.index("## The verdict inside MPK: runtime pass") < page.index("## Compile")
    row = next(ln for ln in page.splitlines() if ln.startswith("| decode | rmsnorm_hopper"))
    assert "| 8 / 8 | 5.05 [5.02, 5.07] | 6.31 [6.28, 6.34] | 0.800× [0.800, 0.800] faster |" in row
    assert "output: cos 0.999900, rel 2.0e-03" in row
    assert "in-runtime faster than rmsnorm_hopper, harness slower than torch" in row
    none = next(ln for ln in page.splitlines() if ln.startswith("| large | linear_swapAB_hopper"))
    assert "no incumbent: TMA descriptors" in none


def test_status_has_one_line_on_the_in_runtime_verdict(tmp_path):
    """`scons status`'s note for the runtime gate: the comparisons against the incumbents by
    verdict, the closest one with its interval, the variants without an incumbent."""
    from types import SimpleNamespace
    from mpkbuild.stages.runtime import judge, report
    launches = lambda us: {"makespan_us": [us * (1 + 0.001 * i) for i in range(20)], "slowcta_us": [us] * 20}
    rt = {"verdict": "pass", "message": "ok", "variants": {
        "a": {"verdict": "pass", "head_to_head": {"ours": launches(5.0), "incumbents": {
            "x": {**launches(6.0), "numerics": {}}, "y": {**launches(5.2), "numerics": {}}}}},
        "b": {"verdict": "pass", "no_incumbent": [{"incumbent": None, "why": "none"}]}}}
    (tmp_path / "runtime.json").write_text(json.dumps(judge.judge(rt, [], ["a", "b"])))
    line = report.status_note(tmp_path, SimpleNamespace(targets=("runtime.json",)))
    assert line.startswith("in-runtime vs incumbent (makespan): 2 faster of 2; closest a vs y 0.96")
    assert line.endswith("; 1 without an incumbent")


def test_a_hot_figure_in_the_l2_is_marked_so_and_only_dram_figures_are_held_to_the_ceiling():
    in_l2 = {"hot": {}, "cold": {}, "hot_bandwidth_fraction": 1.3, "cold_bandwidth_fraction": 1.02,
             "hot_placements": {"working_set_bytes": 28 * 2**20, "l2_bytes": 60 * 2**20}}
    streamed = dict(in_l2, hot_placements={"working_set_bytes": 470 * 2**20, "l2_bytes": 60 * 2**20})
    assert dram_figures(in_l2) == ("cold",) and dram_figures(streamed) == ("hot", "cold")
    marks = bandwidth_marks({"variants": {"m8": in_l2, "large": streamed}})
    assert marks["m8"] == {"hot": " (in L2)", "cold": " (above the ceiling)"}
    assert marks["large"] == {"hot": " (above the ceiling)", "cold": " (above the ceiling)"}


def test_every_figure_says_its_tier_and_the_headline_comes_from_tier1_where_it_ran(tmp_path):
    """TIER-1 (the runtime gate's in-runtime figures) decides the headline where it ran; the
    harness's figures corroborate (shown, their check still fails the build, not counted);
    without a runtime gate the headline says the harness's diagnostic figures decided it."""
    import xml.etree.ElementTree as ET
    for gate, verdict in (("validate", "pass"), ("perf", "fail"), ("runtime", "pass")):
        (tmp_path / f"{gate}.json").write_text(json.dumps({"verdict": verdict, "message": f"{gate} said so"}))
    results = {g: tmp_path / f"{g}.json" for g in ("validate", "perf", "runtime")}
    r = review.kernel_review("k", tmp_path, [], "h200", {}, results)
    assert r["overall"] == "pass" and r["decided_by"]["tier"] == "TIER-1"
    page = review.render_kernel(r)
    assert ("Overall: **pass** · GPU results from `h200` · decided by TIER-1 (in-runtime, production "
            "grid): runtime; not counted, corroboration: perf") in page
    assert ("Figures: diagnostic (event time, standalone): hot, cold, bandwidth · TIER-2 (harness "
            "slowCTA, corroboration): slowcta; its verdict judges its diagnostic figures.") in page
    cases = {c.get("name"): c for c in ET.fromstring(review.junit_xml([r])).iter("testcase")}
    assert cases["runtime"].find("properties/property").get("value") == "TIER-1"
    assert cases["perf"].find("properties/property").get("value") == "diagnostic"
    assert cases["perf"].find("failure") is not None and cases["validate"].find("properties") is None
    del results["runtime"]
    r = review.kernel_review("k", tmp_path, [], "h200", {}, results)
    assert r["overall"] == "fail" and r["decided_by"]["text"] == "diagnostic (event time, standalone): perf"


def test_a_wire_that_failed_fails_the_overall_and_one_not_run_leaves_it_to_the_gates(tmp_path):
    """It never lies: a kernel whose registration into the checkout failed (a clash) does not
    work on that tree, so its overall is fail whatever the gates say; without mpk_root= the
    wire stage only renders, and the overall is the gates'."""
    for gate in ("validate", "perf"):
        (tmp_path / f"{gate}.json").write_text(json.dumps({"verdict": "pass", "message": "ok"}))
    results = {g: tmp_path / f"{g}.json" for g in ("validate", "perf")}
    wire = tmp_path / "wire.json"
    wire.write_text(json.dumps({"verdict": "fail", "message": "TaskType number 160 is taken"}))
    r = review.kernel_review("k", tmp_path, [], "h200", {}, results, wire_result=wire)
    assert r["overall"] == "fail" and r["parts"]["wire"]["verdict"] == "fail"
    wire.write_text(json.dumps({"verdict": "pass", "message": "5 fragments rendered", "mode": "render"}))
    assert review.kernel_review("k", tmp_path, [], "h200", {}, results, wire_result=wire)["overall"] == "pass"
