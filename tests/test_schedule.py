"""The order GPU gates are handed to SCons in: precedence kept, long chains first, GPUs
finishing together (simulated list scheduling, as SCons's -jN job slots take targets)."""
import random

import pytest

from mpkbuild import schedule


def catalog(times: dict):
    gates = list(times)
    needs = {(k, "perf"): [(k, "validate")] for k, g in gates if g == "perf"}
    return gates, needs


# one recorded -j1 run of the catalog on an H200 (seconds per gate)
RECORDED = {("rmsnorm_v2", "validate"): 0.62, ("rmsnorm_v2", "perf"): 2.55,
            ("silu_mul_v2", "validate"): 0.61, ("silu_mul_v2", "perf"): 3.20,
            ("embedding_v2", "validate"): 0.77, ("embedding_v2", "perf"): 0.86,
            ("argmax_v2", "validate"): 0.48, ("argmax_v2", "perf"): 1.51,
            ("linear_v2", "validate"): 0.74, ("linear_v2", "perf"): 0.97}


def plan(*args, **kw):
    """schedule.plan with its trial count, not the wall-time budget, as the bound: the same
    plan on a slow CI machine."""
    return schedule.plan(*args, budget_s=60.0, **kw)


def precedence_kept(order, needs):
    at = {g: i for i, g in enumerate(order)}
    return all(at[d] < at[g] for g, ds in needs.items() for d in ds if g in at and d in at)


def test_simulate_follows_list_scheduling_by_hand():
    sec = {"a": 3.0, "b": 1.0, "c": 1.0, "d": 2.0}
    assert schedule.simulate(["a", "b", "c", "d"], sec, {}, 2) == 4.0    # a | b c d -> 3, 4
    assert schedule.simulate(["a", "b", "c", "d"], sec, {"d": ["a"]}, 2) == 5.0   # d waits for a
    assert schedule.simulate(["a", "b", "c", "d"], sec, {}, 1) == 7.0


def test_a_long_chain_starts_first_and_beats_validates_first():
    """Every validate first delays the one long perf: the critical path starts it at once."""
    times = {("big", "validate"): 1.0, ("big", "perf"): 10.0}
    for k in "abcd":
        times[(k, "validate")] = 1.0
        times[(k, "perf")] = 1.0
    gates, needs = catalog(times)
    # every validate first (big's, no longer than the others, last), then perfs longest first
    validates_first = ([(k, "validate") for k in "abcd"] + [("big", "validate"), ("big", "perf")]
                       + [(k, "perf") for k in "abcd"])
    order = plan(gates, times, needs, 2)
    assert order[0] == ("big", "validate") and precedence_kept(order, needs)
    assert schedule.simulate(order, times, needs, 2) == 11.0
    assert schedule.simulate(validates_first, times, needs, 2) == 13.0


def test_the_recorded_catalog_splits_within_a_tenth_of_a_second_over_two_gpus():
    gates, needs = catalog(RECORDED)
    order = plan(gates, RECORDED, needs, 2)
    assert precedence_kept(order, needs)
    half = sum(RECORDED.values()) / 2
    assert schedule.simulate(order, RECORDED, needs, 2) <= half + 0.1
    assert order == plan(gates, RECORDED, needs, 2)      # the same plan every run


@pytest.mark.parametrize("seed", range(20))
def test_plans_keep_precedence_and_never_lose_to_the_critical_path(seed):
    rnd = random.Random(seed)
    times = {}
    for k in range(rnd.randint(2, 9)):
        times[(f"k{k}", "validate")] = rnd.uniform(0.2, 1.0)
        if rnd.random() < 0.8:
            times[(f"k{k}", "perf")] = rnd.uniform(0.5, 4.0)
    gates, needs = catalog(times)
    slots = rnd.randint(2, 4)
    order = plan(gates, times, needs, slots)
    assert sorted(order) == sorted(gates) and precedence_kept(order, needs)
    cp = schedule.critical_path_order(gates, times, needs)
    assert precedence_kept(cp, needs)
    assert schedule.simulate(order, times, needs, slots) <= schedule.simulate(cp, times, needs, slots) + 1e-9
    assert schedule.simulate(order, times, needs, slots) >= max(sum(times.values()) / slots,
                                                                 max(times.values())) - 1e-9


def test_one_gpu_gives_every_validate_first_then_the_perfs_shortest_first():
    times = {**RECORDED, ("embedding_v2", "validate"): 1.05, ("linear_v2", "perf"): 0.66}
    gates, needs = catalog(times)
    order = plan(gates, times, needs, 1, kind_rank=lambda g: g[1] == "perf")
    assert [g for _, g in order[:5]] == ["validate"] * 5       # even one longer than a perf
    assert order[:5] == sorted(order[:5], key=times.get)
    assert order[5:] == sorted(order[5:], key=times.get)


def test_a_wait_after_a_timing_gate_counts_in_the_plan():
    """switch gets the gates run before on the same slot: a gate after a perf there waits."""
    after_perf = lambda history, g: 0.3 if history and history[-1][1] == "perf" else 0.0
    sec = {("a", "validate"): 1.0, ("a", "perf"): 2.0, ("b", "validate"): 1.0}
    needs = {("a", "perf"): [("a", "validate")]}
    order = [("a", "validate"), ("a", "perf"), ("b", "validate")]
    assert schedule.simulate(order, sec, needs, 1, after_perf) == 4.3
    assert schedule.simulate([order[0], order[2], order[1]], sec, needs, 1, after_perf) == 4.0
    gates, needs = catalog(RECORDED)
    for slots in (2, 3):
        with_wait = plan(gates, RECORDED, needs, slots, switch=after_perf)
        without = plan(gates, RECORDED, needs, slots)
        assert (schedule.simulate(with_wait, RECORDED, needs, slots, after_perf)
                <= schedule.simulate(without, RECORDED, needs, slots, after_perf))


def test_context_wait_counts_only_a_run_of_timing_gates_as_long_as_the_spares():
    """The warm server's spares make contexts beside a validate only; each gate takes one."""
    wait = schedule.context_wait(lambda g: g[1] == "perf", spares=2, wait_s=0.2)
    v, p = ("k", "validate"), ("k", "perf")
    assert wait([], p) == 0.0 and wait([p], p) == 0.0 and wait([v, p], p) == 0.0
    assert wait([p, p], v) == 0.2 and wait([v, p, p], p) == 0.2
    assert wait([p, p, v], p) == 0.0
    assert schedule.context_wait(lambda g: g[1] == "perf", spares=3, wait_s=0.2)([p, p], p) == 0.0


CONTEXT_WAIT = schedule.context_wait(lambda g: g[1] == "perf", spares=2, wait_s=0.2)


def test_one_gpu_puts_each_perf_after_a_validate_when_perfs_in_a_row_would_wait():
    """Six validates then six perfs: the last four perfs wait for a context (the fifth
    session's -j1 builds, ~1 s). Kernel by kernel, shortest first, none waits."""
    times = {**RECORDED, ("argmax_fp32_v2", "validate"): 0.5, ("argmax_fp32_v2", "perf"): 1.4}
    gates, needs = catalog(times)
    by_kind = plan(gates, times, needs, 1, kind_rank=lambda g: g[1] == "perf")
    order = plan(gates, times, needs, 1, kind_rank=lambda g: g[1] == "perf", switch=CONTEXT_WAIT)
    assert sorted(order) == sorted(gates) and precedence_kept(order, needs)
    assert [g for _, g in order] == ["validate", "perf"] * 6
    assert [k for k, _ in order[::2]] == [k for k, _ in order[1::2]]
    pair = lambda k: times[(k, "validate")] + times[(k, "perf")]
    assert [pair(k) for k, _ in order[::2]] == sorted(pair(k) for k, _ in order[::2])
    total = sum(times.values())
    assert schedule.simulate(order, times, needs, 1, CONTEXT_WAIT) == pytest.approx(total)
    assert schedule.simulate(by_kind, times, needs, 1, CONTEXT_WAIT) == pytest.approx(total + 0.8)


def test_one_gpu_keeps_every_validate_first_when_nothing_waits():
    """stage=validate, or perfs alone (their validates up to date): the order by kind costs
    no more than chains, so the correctness verdicts still come first."""
    validates = {g: t for g, t in RECORDED.items() if g[1] == "validate"}
    perfs = {g: t for g, t in RECORDED.items() if g[1] == "perf"}
    for times in (validates, perfs):
        gates, needs = catalog(times)
        order = plan(gates, times, needs, 1, kind_rank=lambda g: g[1] == "perf", switch=CONTEXT_WAIT)
        assert order == sorted(gates, key=times.get)
    # two kernels: validate, validate, perf, perf waits for nothing with two spares
    two = {g: t for g, t in RECORDED.items() if g[0] in ("rmsnorm_v2", "argmax_v2")}
    gates, needs = catalog(two)
    order = plan(gates, two, needs, 1, kind_rank=lambda g: g[1] == "perf", switch=CONTEXT_WAIT)
    assert [g for _, g in order] == ["validate", "validate", "perf", "perf"]


def test_a_gate_never_timed_is_expected_to_take_the_median_of_its_kind():
    gates = [("a", "validate"), ("b", "validate"), ("c", "validate"), ("a", "perf"), ("c", "perf")]
    last = {("a", "validate"): 0.5, ("b", "validate"): 0.9, ("a", "perf"): 3.0}
    est = schedule.estimates(gates, last, kind=lambda g: g[1])
    assert est[("c", "validate")] == pytest.approx(0.7) and est[("c", "perf")] == 3.0
    assert schedule.estimates([("x", "perf")], {}, kind=lambda g: g[1]) == {("x", "perf"): 1.0}
