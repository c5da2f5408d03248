"""Honest numbers (issue 32): intervals and verdicts from paired samples, unsure never a
pass, the ledger and regressions, the reports (JUnit XML, JSON), the perf schema's
baselines and read/write bytes, and the ceiling for a read:write mix."""
import json
import math
import random
import xml.etree.ElementTree as ET

import pytest

from mpkbuild.stages.perf import judge as perfcheck, ledger as history
from mpkbuild.stages import review
from mpkbuild.util import perfspec, stats


def noisy(us, n, rel, rng):
    return [us * (1.0 + rng.gauss(0.0, rel)) for _ in range(n)]


def test_the_median_interval_has_its_stated_coverage():
    for n in (7, 10, 20, 50, 101):
        k = stats.median_rank(n)
        assert stats.coverage(n, k) >= 0.95
        assert stats.coverage(n, k + 1) < 0.95 or k + 1 > (n + 1) // 2    # the narrowest that does
    med, lo, hi = stats.median_ci(list(range(1, 21)))
    assert (med, lo, hi) == (10.5, 6, 15)


def test_an_aa_set_covers_one_in_at_least_95_percent_of_rounds():
    rng = random.Random(32)
    covered, rounds = 0, 400
    for _ in range(rounds):
        drift = [1.0 + 0.05 * math.sin(j / 3) for j in range(25)]      # a drift both sides see
        a = [d * x for d, x in zip(drift, noisy(2.0, 25, 0.01, rng))]
        b = [d * x for d, x in zip(drift, noisy(2.0, 25, 0.01, rng))]
        c = stats.ratio_figure(a, b)
        covered += c["lo"] <= 1.0 <= c["hi"]
        assert c["verdict"] in ("same", "unsure", "faster", "slower")
    assert covered / rounds >= 0.95


def test_a_clear_ten_percent_difference_is_slower_and_its_mirror_faster():
    rng = random.Random(1)
    base = noisy(2.0, 15, 0.01, rng)
    slow = [x * 1.10 * (1 + rng.gauss(0, 0.01)) for x in base]
    c = stats.ratio_figure(slow, base)
    assert c["verdict"] == "slower" and c["lo"] > 1.05 and abs(c["ratio"] - 1.10) < 0.02
    assert stats.ratio_figure(base, slow)["verdict"] == "faster"
    same = stats.ratio_figure([x * (1 + rng.gauss(0, 0.002)) for x in base], base)
    assert same["verdict"] == "same"
    wide = stats.ratio_figure(noisy(2.0, 7, 0.2, rng), noisy(2.0, 7, 0.2, rng))
    assert wide["verdict"] == "unsure"
    assert stats.ratio_figure([], [])["verdict"] == "unsure"


def test_threshold_verdicts_follow_the_interval():
    assert stats.at_most(0.90, 0.99, 1.0) == "pass"
    assert stats.at_most(1.01, 1.10, 1.0) == "fail"
    assert stats.at_most(0.98, 1.02, 1.0) == "unsure"
    assert stats.at_least(0.86, 0.9, 0.85) == "pass"
    assert stats.at_least(0.80, 0.84, 0.85) == "fail"
    assert stats.at_least(0.84, 0.86, 0.85) == "unsure"


def fig(us, noise, phase=0.0, n=21):
    samples = [us * (1 + noise * math.sin(1.7 * j + phase)) for j in range(n)]
    return {"median_us": sorted(samples)[n // 2], "samples_us": samples}


def variant(ours, torch_us=2.0, noise=0.004, **baselines):
    r = {"hot": fig(ours, noise), "baseline_hot": fig(torch_us, noise, 1.0),
         "hot_bandwidth_fraction": 0.9, "slowcta": {"slowest_task_us": 1.0},
         "baselines": {"torch": {"hot": fig(torch_us, noise, 1.0)}}}
    for name, us in baselines.items():
        r["baselines"][name] = {"hot": fig(us, noise, 2.0), "compile": True}
    r["vs_baseline_hot"] = ours / torch_us
    return r


def timed(variants):
    return {"verdict": "timed", "message": "timed", "variants": variants}


def test_a_threshold_the_interval_straddles_is_unsure_and_not_a_pass():
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    clear = perfcheck.judge(timed({"v": variant(1.0)}), rule, ["v"])
    assert clear["verdict"] == "pass" and clear["unsure"] == []
    at_limit = perfcheck.judge(timed({"v": variant(2.0, noise=0.02)}), rule, ["v"])
    assert at_limit["verdict"] == "unsure"
    assert at_limit["message"].startswith("unsure: v: 2.00 us is 1.00x the baseline's 2.00 us (limit 1.0x; 95% CI")
    worse = perfcheck.judge(timed({"v": variant(2.4)}), rule, ["v"])
    assert worse["verdict"] == "fail" and "1.20x" in worse["message"]
    # a rule naming another baseline is judged against that one
    vs_compile = [{"variants": "*", "max_time_vs_baseline": 1.0, "baseline": "compile"}]
    res = perfcheck.judge(timed({"v": variant(1.0, compile=0.8)}), vs_compile, ["v"])
    assert res["verdict"] == "fail" and "compile's 0.80 us" in res["message"]
    assert res["variants"]["v"]["vs"]["compile"]["hot"]["verdict"] == "slower"
    assert res["variants"]["v"]["vs"]["torch"]["hot"]["verdict"] == "faster"


def test_unsure_is_never_shown_as_passed(tmp_path):
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    res = perfcheck.judge(timed({"v": variant(2.0, noise=0.02)}), rule, ["v"])
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps(res))
    data = review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf})
    assert data["overall"] == "unsure" and data["parts"]["perf"]["verdict"] == "unsure"
    page = review.render_kernel(data)
    assert "## perf: unsure" in page and "**Unsure**" in page and "Overall: **unsure**" in page
    root = ET.fromstring(review.junit_xml([data]))
    case = root.find("testsuite/testcase[@name='perf']")
    assert case.find("skipped") is not None and case.find("failure") is None
    assert case.find("skipped").get("message").startswith("unsure: ")


def test_the_review_names_the_fastest_baseline_where_ours_is_not_faster(tmp_path):
    res = perfcheck.judge(timed({"decode_a": variant(1.0, compile=0.9), "decode_b": variant(0.5, compile=0.9)}),
                          [], ["decode_a", "decode_b"])
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps(res))
    data = review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf})
    page = review.render_kernel(data)
    behind = [ln for ln in page.splitlines() if ln.startswith("* ")]
    assert len(behind) == 1 and behind[0].startswith("* decode_a hot: 1.00 µs vs compile 0.90 µs (1.111× [")
    assert behind[0].endswith("slower)")
    row = next(ln for ln in page.splitlines() if ln.startswith("| decode_b | hot |"))
    assert "0.250× [" in row and "faster" in row


def test_junit_and_json_reports_parse_and_count(tmp_path):
    res = perfcheck.judge(timed({"v": variant(2.4)}), [{"variants": "*", "max_time_vs_baseline": 1.0}], ["v"])
    perf, val = tmp_path / "perf.json", tmp_path / "validate.json"
    perf.write_text(json.dumps(res))
    val.write_text(json.dumps({"verdict": "pass", "message": "ok"}))
    data = review.kernel_review("k", tmp_path, [], "h200", {}, {"validate": val, "perf": perf})
    review.write_kernel_review(data, tmp_path / "review.md", tmp_path / "review.json", tmp_path / "junit.xml")
    root = ET.parse(tmp_path / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite.get("name") == "k" and suite.get("tests") == "2" and suite.get("failures") == "1"
    fail = suite.find("testcase[@name='perf']/failure")
    assert fail.get("type") == "fail" and "1.20x" in fail.get("message")
    assert suite.find("testcase[@name='validate']").find("failure") is None
    back = json.loads((tmp_path / "review.json").read_text())
    assert back["parts"]["perf"]["verdict"] == "fail"
    assert back["parts"]["perf"]["table"][0]["baselines"]["torch"]["hot"]["vs"]["verdict"] == "slower"
    # the picture is optional: either written or a note saying why not
    assert (back["plot"] == "perf.png") == (tmp_path / "perf.png").exists()
    if back["plot"] is None:
        assert "matplotlib" in back["plot_note"] and "matplotlib" in (tmp_path / "review.md").read_text()


def test_the_ledger_accepts_a_pass_and_a_confirmed_regression_fails(tmp_path):
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    first = perfcheck.judge(timed({"v": variant(1.0)}), rule, ["v"])
    assert first["verdict"] == "pass" and first["history"] is None
    with pytest.raises(ValueError):
        history.accept(tmp_path, "k", "h200", {**first, "verdict": "fail"})
    assert history.fact(tmp_path, "h200", "k") == "history: none"
    path = history.accept(tmp_path, "k", "h200", first, note="baseline run")
    assert path == tmp_path / "perf_history" / "h200" / "k.json"
    fact = history.fact(tmp_path, "h200", "k")
    assert fact.startswith("history: ") and fact != "history: none"
    entry = history.last_entry(tmp_path, "h200", "k")
    assert entry["note"] == "baseline run" and entry["variants"]["v"]["hot"]["lo"] < 1.0 < entry["variants"]["v"]["hot"]["hi"]
    # 8% slower: still under the torch limit, but a regression the interval confirms
    slower = perfcheck.judge(timed({"v": variant(1.08)}), rule, ["v"], history=entry)
    assert slower["verdict"] == "fail"
    assert slower["message"].startswith("v: hot 1.08 us is 1.080x the accepted 1.00 us")
    assert slower["variants"]["v"]["history"]["hot"]["verdict"] == "regressed"
    # the same again: judged same, passes; a 1% change within the noise does not fail
    again = perfcheck.judge(timed({"v": variant(1.0)}), rule, ["v"], history=entry)
    assert again["verdict"] == "pass" and again["variants"]["v"]["history"]["hot"]["verdict"] == "same"
    nudge = perfcheck.judge(timed({"v": variant(1.01)}), rule, ["v"], history=entry)
    assert nudge["verdict"] == "pass"
    faster = perfcheck.judge(timed({"v": variant(0.9)}), rule, ["v"], history=entry)
    assert faster["variants"]["v"]["history"]["hot"]["verdict"] == "faster"
    # a looser tolerance lets the 8% through
    assert perfcheck.judge(timed({"v": variant(1.08)}), rule, ["v"], history=entry,
                           max_regression=0.1)["verdict"] == "pass"
    history.accept(tmp_path, "k", "h200", again)
    assert len(history.load(tmp_path, "h200", "k")["entries"]) == 2


def test_a_regression_needs_the_time_and_the_ratio_to_the_baseline_to_agree():
    """A process that sits 20% slow moves kernel and torch alike (seen on an H200 at 1.3 us
    shapes); a faster torch moves only the ratio. Neither alone is a confirmed regression,
    and neither is a pass."""
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    entry = history.entry_from_result(perfcheck.judge(timed({"v": variant(1.0)}), rule, ["v"]))
    assert entry["variants"]["v"]["vs_baseline"]["hot"]["lo"] < 0.5 < entry["variants"]["v"]["vs_baseline"]["hot"]["hi"]
    offset = perfcheck.judge(timed({"v": variant(1.2, torch_us=2.4)}), rule, ["v"], history=entry)
    d = offset["variants"]["v"]["history"]["hot"]
    assert d["lo"] > 1.1 and d["vs_baseline"]["lo"] < 1.0 < d["vs_baseline"]["hi"]
    assert d["verdict"] == "unconfirmed" and offset["verdict"] == "unsure" and offset["problems"] == []
    assert "the time only" in offset["message"] and offset["history"]["unsure"]
    new_torch = perfcheck.judge(timed({"v": variant(1.0, torch_us=1.8)}), rule, ["v"], history=entry)
    assert new_torch["variants"]["v"]["history"]["hot"]["verdict"] == "unconfirmed"
    assert new_torch["verdict"] == "unsure" and "the ratio only" in new_torch["message"]
    both = perfcheck.judge(timed({"v": variant(1.1)}), rule, ["v"], history=entry)
    assert both["verdict"] == "fail" and both["variants"]["v"]["history"]["hot"]["verdict"] == "regressed"
    assert "its ratio to torch is 1.100x the accepted one" in both["message"]
    # an entry from before the ratios were kept is judged on its time alone
    old = {**entry, "variants": {"v": {k: x for k, x in entry["variants"]["v"].items() if k != "vs_baseline"}}}
    assert perfcheck.judge(timed({"v": variant(1.2, torch_us=2.4)}), rule, ["v"], history=old)["verdict"] == "fail"


def with_cold(r, ours, torch_us=2.0):
    r["cold"] = fig(ours, 0.004, 0.5)
    r["baselines"]["torch"]["cold"] = fig(torch_us, 0.004, 1.5)
    return r


def test_history_judges_the_cold_figure_where_there_is_one():
    """The hot figure is one buffer set's L2 placement, which moves between processes (an
    H200: linear_v2 m8 4096^2 4.8% hot, its ratio 9%, nothing changed; cold within 3%):
    a hot-only shift is shown, not judged; a cold regression fails."""
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    entry = history.entry_from_result(perfcheck.judge(timed({"v": with_cold(variant(1.0), 1.5)}), rule, ["v"]))
    placed = perfcheck.judge(timed({"v": with_cold(variant(1.1), 1.5)}), rule, ["v"], history=entry)
    hot, cold = placed["variants"]["v"]["history"]["hot"], placed["variants"]["v"]["history"]["cold"]
    assert hot["lo"] > 1.05 and hot["vs_baseline"]["lo"] > 1.05 and not hot["judged"]
    assert hot["verdict"] == "slower" and cold["judged"] and cold["verdict"] == "same"
    assert placed["verdict"] == "pass" and placed["history"]["regressions"] == []
    slower = perfcheck.judge(timed({"v": with_cold(variant(1.0), 1.65)}), rule, ["v"], history=entry)
    assert slower["verdict"] == "fail" and slower["message"].startswith("v: cold 1.65 us is 1.100x the accepted")


def test_the_review_says_which_history_figure_was_judged(tmp_path):
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    entry = history.entry_from_result(perfcheck.judge(timed({"v": with_cold(variant(1.0), 1.5)}), rule, ["v"]))
    res = perfcheck.judge(timed({"v": with_cold(variant(1.1), 1.5)}), rule, ["v"], history=entry)
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps(res))
    page = review.render_kernel(review.kernel_review("k", tmp_path, [], "h200", {}, {"perf": perf}))
    hot = next(ln for ln in page.splitlines() if ln.startswith("| v | hot |"))
    cold = next(ln for ln in page.splitlines() if ln.startswith("| v | cold |"))
    assert "slower (shown, not judged)" in hot and "same |" in cold and "not judged" not in cold


def test_the_ceiling_follows_the_read_write_mix():
    bw = {"copy_bandwidth_Bps": 4.0e12, "ceilings_Bps": {"1:1": 4.0e12, "2:1": 4.3e12, "read": 4.6e12}}
    assert perfspec.ceiling(bw, None, None) == {"mix": "1:1", "read_share": None, "Bps": 4.0e12}
    assert perfspec.ceiling(bw, 2.0, 1.0)["Bps"] == pytest.approx(4.3e12)
    assert perfspec.ceiling(bw, 2.0, 1.0)["mix"] == "2:1"
    assert perfspec.ceiling(bw, 1.0, 0.0)["mix"] == "read"
    assert perfspec.ceiling(bw, 1.0, 3.0)["Bps"] == 4.0e12           # write-heavy: the copy's
    mid = perfspec.ceiling(bw, 5.0, 1.0)                              # 5/6 between 2:1 and read
    assert 4.3e12 < mid["Bps"] < 4.6e12 and mid["mix"] == "2:1..read"
    old = {"copy_bandwidth_Bps": 4.0e12}                              # a node from before the mixes
    assert perfspec.ceiling(old, 2.0, 1.0)["Bps"] == 4.0e12
    from mpkbuild.util.expr import variant_facts
    cg = {"threads": 128, "params": {}, "grid": ["rows // 2"], "variants": {"r8": {"rows": 8}},
          "inputs": [{"name": "x", "dtype": "bf16", "shape": ["rows", 64], "partition": [0, -1]}],
          "outputs": [{"name": "y", "dtype": "bf16", "shape": ["rows", 64], "partition": [0, -1]}]}
    mixed = variant_facts(cg, {"bytes": {"read": "rows * 4", "write": "rows * 2"}})["r8"]
    assert mixed["bytes"] == {"total": 48.0, "read": 32.0, "write": 16.0}
    assert mixed["grid"] == 4 and mixed["inputs"] == [{"name": "x", "shape": [8, 64], "dtype": "bf16"}]
    assert variant_facts(cg, {"bytes": "rows * 6"})["r8"]["bytes"] == {"total": 48.0, "read": None, "write": None}
    assert variant_facts(cg)["r8"]["bytes"] is None         # a job that reads no perf section


def test_the_schema_takes_several_baselines_and_read_write_bytes(project):
    spec = project.path("specs/rmsnorm_v2.yaml")
    text = spec.read_text()
    assert "compile: true" in text and "bytes: {read:" in text
    from mpkbuild.model.spec import SpecError
    from mpkbuild.stages import load_spec
    loaded = load_spec(spec, project.root)
    got = perfspec.baselines(loaded.data["perf"])
    assert [b["name"] for b in got] == ["torch", "compile", "autotune"]
    assert [(b["compile"], b["mode"]) for b in got] == [(False, None), (True, "default"),
                                                        (True, "max-autotune-no-cudagraphs")]
    # the old scalar still loads
    spec.write_text(text.replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}",
                                 "bytes: (2 * rows * hidden + hidden) * 2"))
    assert load_spec(spec, project.root).data["perf"]["bytes"] == "(2 * rows * hidden + hidden) * 2"
    for bad, where in (
            (text.replace("{name: compile,", "{name: torch,"), "perf.baselines[0].name"),
            (text.replace("write: rows * hidden * 2}", "writes: rows * hidden * 2}"), "perf.bytes"),
            (text.replace("reference.py:torch_rms_norm\", compile", "reference.py:nope\", compile"),
             "perf.baselines[0].function"),
            (text.replace('{variants: "decode_*", max_time_vs_baseline: 1.0}',
                          '{variants: "decode_*", max_time_vs_baseline: 1.0, baseline: inductor}'),
             ".baseline")):
        spec.write_text(bad)
        with pytest.raises(SpecError) as exc:
            load_spec(spec, project.root)
        assert where in str(exc.value), str(exc.value)


def test_a_per_capture_offset_the_samples_cannot_see_is_covered_by_the_floor():
    """Two captures of one op on an H200 differed by up to 0.69% (bench/aa_test.py): the
    samples' own interval misses it, the widened one does not."""
    rng = random.Random(7)
    a = noisy(2.0, 15, 0.0005, rng)
    b = [x * 1.006 for x in noisy(2.0, 15, 0.0005, rng)]      # graph b sits 0.6% higher
    raw = stats.ratio_figure(a, b, floor=0.0)
    assert not raw["lo"] <= 1.0 <= raw["hi"] and raw["verdict"] == "faster"
    widened = stats.ratio_figure(a, b)
    assert widened["lo"] <= 1.0 <= widened["hi"] and widened["verdict"] == "same"
    assert widened["lo_samples"] == raw["lo"] and widened["floor"] == stats.CAPTURE_FLOOR


def test_status_shows_the_delta_to_the_accepted_result(tmp_path):
    from types import SimpleNamespace
    from mpkbuild.stages.perf.report import status_note
    rule = [{"variants": "*", "max_time_vs_baseline": 1.0}]
    entry = history.entry_from_result(perfcheck.judge(timed({"v": variant(1.0)}), rule, ["v"]))
    res = perfcheck.judge(timed({"v": variant(1.08)}), rule, ["v"], history=entry)
    (tmp_path / "perf.json").write_text(json.dumps(res))
    node = SimpleNamespace(targets=("perf.json",), kernel="k")
    line = status_note(tmp_path, node)
    assert line.startswith(f"vs accepted {entry['accepted']}: hot 0 faster, 1 slower of 1; largest v 1.080x [")
    assert line.endswith("regressed; 1 regression confirmed")
    first = perfcheck.judge(timed({"v": variant(1.0)}), rule, ["v"])
    (tmp_path / "perf.json").write_text(json.dumps(first))
    assert status_note(tmp_path, node).startswith("no accepted result for this GPU")
