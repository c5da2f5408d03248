"""A perf gate shares its variants with GPUs that are free while it runs (local executor,
-j2 or more): stand-in perf runners that claim variants as the real one does, on the
stand-in nvidia-smi's two GPUs, cold runners (no torch needed)."""
import json
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import stand_in_runners
from mpkbuild import leases, perfcheck
from mpkbuild.executor import GateJob, LocalExecutor, longest_first, variant_seconds

FAKES = Path(__file__).parent / "fakes"

# Times the variants it claims through mpkbuild.claims, as the real runner does (sleep = the
# variant's "seconds"); "crash" variants die as a CUDA fault does. Records where each ran
# (CUDA_VISIBLE_DEVICES).
STAND_IN_PERF = """
import json, os, sys, time
from mpkbuild.claims import claim          # the real runner's claims
job = json.load(open(sys.argv[1]))
share = job.get("share") or {}
specs = job["codegen"]["codegen"]["variants"]
order, folder = share.get("order") or list(specs), share.get("claims_dir")
done = {}
for v in order:
    if not claim(folder, v):
        continue
    print("perf variant", v, flush=True)
    if specs[v].get("crash"):
        print("CUDA error: an illegal memory access was encountered", flush=True)
        os._exit(3)
    time.sleep(specs[v]["seconds"])
    us = specs[v]["us"]
    done[v] = {"hot": {"median_us": us}, "baseline_hot": {"median_us": 2.0}, "vs_baseline_hot": us / 2.0,
               "hot_bandwidth_fraction": 0.5, "timings_s": {"replay": specs[v]["seconds"]},
               "ran_on": os.environ.get("CUDA_VISIBLE_DEVICES")}
json.dump({"verdict": "timed", "device": {"name": "Fake H200"}, "copy_bandwidth_Bps": 1e12,
           "variants": done, "message": "timed"}, open(job["result_file"], "w"))
"""


@pytest.fixture
def two_gpus(tmp_path, monkeypatch):
    stand_in_runners(tmp_path, "share_runners", {"perf": STAND_IN_PERF}, monkeypatch)
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPK_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path


def executor(jobs=2):
    ex = LocalExecutor({"warm": "0"})
    ex.runner_package, ex.jobs = "share_runners", jobs
    return ex


def perf_job(tmp_path, variants: dict, timeout=60.0) -> GateJob:
    work = tmp_path / "build" / "k" / "gpu" / "fake"
    work.mkdir(parents=True, exist_ok=True)
    return GateJob("perf", "k", {"root": str(tmp_path), "codegen": {"codegen": {"variants": variants}}},
                   work, timeout)


SIX = {f"v{i}": {"seconds": 0.4, "us": 1.0 + i / 10} for i in range(6)}


def uuid_of(index: int) -> str:
    return next(g.uuid for g in leases.list_gpus() if g.index == index)


def test_a_free_gpu_takes_a_share_of_the_variants(two_gpus):
    started = time.monotonic()
    result = executor().run(perf_job(two_gpus, SIX))
    took = time.monotonic() - started
    assert result["verdict"] == "timed" and set(result["variants"]) == set(SIX)
    parts = result["shared"]
    assert sorted(p["gpu_index"] for p in parts) == [0, 1]
    assert all(p["variants"] for p in parts)                       # both GPUs timed some
    for name, figures in result["variants"].items():                # each says where it ran
        assert figures["ran_on"] == uuid_of(figures["gpu_index"]), name
    assert took < 6 * 0.4, took                                     # faster than one GPU alone
    log = (two_gpus / "build/k/gpu/fake/perf.log").read_text()
    assert "the runner that shared this gate on GPU 1" in log and log.count("perf variant") == 6
    work = two_gpus / "build/k/gpu/fake"
    assert not (work / ".perf-claims").exists() and not (work / ".perf-helpers").exists()


def test_one_gpu_with_j1_or_when_the_other_gpu_is_busy(two_gpus):
    result = executor(jobs=1).run(perf_job(two_gpus, SIX))
    assert result["verdict"] == "timed" and "shared" not in result and len(result["variants"]) == 6
    gpus = leases.list_gpus()
    with leases.acquire([gpus[1]]):                                 # another gate holds GPU 1
        result = executor().run(perf_job(two_gpus, SIX))
    assert [p["gpu_index"] for p in result["shared"]] == [0]
    assert all(f["gpu_index"] == 0 for f in result["variants"].values())


def test_a_gpu_freed_while_the_gate_runs_joins_it(two_gpus):
    gpus = leases.list_gpus()
    busy = leases.acquire([gpus[1]])
    threading.Timer(0.6, busy.release).start()
    result = executor().run(perf_job(two_gpus, SIX))
    assert [p["gpu_index"] for p in result["shared"]] == [0, 1]
    assert len(result["shared"][0]["variants"]) > len(result["shared"][1]["variants"]) > 0


def test_a_crash_anywhere_is_the_gates_verdict_and_stops_the_claiming(two_gpus):
    variants = dict(SIX)
    variants["v1"] = {"seconds": 0.4, "us": 1.0, "crash": True}
    result = executor().run(perf_job(two_gpus, variants))
    assert result["verdict"] == "crash"
    assert "illegal memory access" in result["message"]
    judged = perfcheck.judge(result, [], list(variants))
    assert judged["verdict"] == "crash"                             # never turned into a pass


def test_claims_go_longest_first_by_the_last_result(tmp_path):
    previous = tmp_path / "perf.json"
    previous.write_text(json.dumps({"variants": {"a": {"timings_s": {"replay": 0.1}},
                                                 "b": {"timings_s": {"capture": 0.5, "replay": 0.4}},
                                                 "c": {"timings_s": {"replay": 0.3}}}}))
    assert longest_first(variant_seconds(previous, ["a", "b", "c", "d"])) == ["b", "c", "a", "d"]
    assert longest_first(variant_seconds(tmp_path / "none.json", ["a", "b"])) == ["a", "b"]


def test_the_build_judges_timed_figures_and_a_missing_variant_is_no_pass():
    figures = {"hot": {"median_us": 3.0}, "baseline_hot": {"median_us": 2.0}, "vs_baseline_hot": 1.5,
               "hot_bandwidth_fraction": 0.9}
    timed = {"verdict": "timed", "variants": {"b": dict(figures), "a": dict(figures)}, "message": "timed"}
    rules = [{"variants": "a", "max_time_vs_baseline": 1.2}]
    judged = perfcheck.judge(timed, rules, ["a", "b"])
    assert judged["verdict"] == "fail" and list(judged["variants"]) == ["a", "b"]
    assert judged["message"].startswith("a: 3.00 us is 1.50x the baseline's 2.00 us (limit 1.2x)")
    assert judged["variants"]["a"]["limits"] == rules and judged["variants"]["b"]["limits"] == []
    assert perfcheck.judge(timed, [], ["a", "b"])["verdict"] == "pass"
    short = perfcheck.judge(timed, [], ["a", "b", "c"])
    assert short["verdict"] == "crash" and "no figures for c" in short["message"]
    assert perfcheck.judge({"verdict": "hang", "message": "x"}, rules, ["a"]) == {"verdict": "hang", "message": "x"}


def test_a_gpu_between_two_gates_of_the_build_is_left_to_the_next_gate(two_gpus):
    """When a gate ends, SCons hands its GPU the next gate within a few tens of ms: a
    helper of a running perf gate must not take the GPU in that gap (the next gate would
    wait for the helper's variant), only once the slot has stayed idle."""
    ex = executor()
    one = lambda name, seconds: {name: {"seconds": seconds, "us": 1.0}}   # noqa: E731
    results = {}

    def long_gate():
        results["a"] = ex.run(perf_job(two_gpus, SIX))

    def two_in_a_row():
        results["b"] = ex.run(perf_job(two_gpus / "b", one("b", 0.6)))
        time.sleep(0.08)                                 # SCons picking the next gate
        results["c"] = ex.run(perf_job(two_gpus / "c", one("c", 0.4)))

    threads = [threading.Thread(target=long_gate), threading.Thread(target=two_in_a_row)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join()
    assert results["b"]["gpu_index"] == results["c"]["gpu_index"] == 1
    assert results["c"]["lease_wait_s"] < 0.05
    parts = results["a"]["shared"]
    assert [p["gpu_index"] for p in parts] == [0, 1]    # GPU 1 joined once it stayed free
    assert parts[1]["started_at"] >= results["c"]["ended_at"]


def test_no_helper_for_variants_too_short_to_pay_for_its_start(two_gpus):
    job = perf_job(two_gpus, SIX)
    job.workdir.joinpath("perf.json").write_text(json.dumps(
        {"variants": {v: {"timings_s": {"replay": 0.02}} for v in SIX}}))
    result = executor().run(job)
    assert result["verdict"] == "timed" and len(result["variants"]) == 6
    assert [p["gpu_index"] for p in result["shared"]] == [0]
