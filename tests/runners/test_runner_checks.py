"""The GPU runners' host-side logic on CPU: validate's checks (poison, NaN, tolerances, exact
mode) and the timing warm-up."""
import math

import torch

from mpkbuild.runners.common import bits_equal, poison_, unwritten_mask
from mpkbuild.runners.validate import compare

TOL = {"compare": "tolerance", "cos_min": 0.999, "rel_max": 3e-2}


def test_poison_marks_every_element_unwritten():
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64):
        t = torch.zeros(17, dtype=dtype)
        poison_(t)
        assert bool(unwritten_mask(t).all()), dtype
        t[3] = 1
        assert int(unwritten_mask(t).sum()) == 16


def test_partly_unwritten_output_fails():
    ref = torch.randn(64, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    out[10:20].view(torch.int16).fill_(0x7FAB)
    numbers, problem = compare(out, ref, TOL)
    assert numbers == {"unwritten": 10}
    assert "not fully written: 10 of 64" in problem and "flat index 10" in problem


def test_nan_never_passes_even_with_loose_tolerances():
    ref = torch.randn(64, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    out[5] = float("nan")
    _, problem = compare(out, ref, {"compare": "tolerance", "cos_min": 0.0, "rel_max": math.inf})
    assert problem and "NaN" in problem


def test_accurate_output_passes_and_reports_numbers():
    ref = torch.randn(4096, dtype=torch.float64)
    numbers, problem = compare(ref.to(torch.bfloat16), ref, TOL)
    assert problem is None
    assert numbers["cos"] > 0.9999 and numbers["rel"] < 1e-2


def test_relative_error_over_limit_fails():
    ref = torch.randn(4096, dtype=torch.float64)
    out = (ref * 1.05).to(torch.bfloat16)
    numbers, problem = compare(out, ref, TOL)
    assert problem.startswith("rel ") and numbers["rel"] > 3e-2


def test_low_cosine_fails():
    ref = torch.randn(4096, dtype=torch.float64)
    out = torch.randn(4096).to(torch.bfloat16)
    _, problem = compare(out, ref, TOL)
    assert problem.startswith("cos ")


def test_exact_mode_ignores_tolerances_and_names_first_mismatch():
    ref = torch.arange(100, dtype=torch.int64)
    out = ref.to(torch.int32).clone()
    out[42] = 7
    numbers, problem = compare(out, ref, {**TOL, "compare": "exact"})
    assert numbers == {"mismatches": 1} and "flat index 42" in problem
    assert compare(ref.to(torch.int32), ref, {**TOL, "compare": "exact"})[1] is None


def test_bits_equal_sees_a_one_ulp_difference():
    a = torch.randn(32).to(torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[7] += 1
    assert bits_equal(a, a.clone()) and not bits_equal(a, b)


def test_pointer_table_holds_each_sets_addresses_set_major():
    from mpkbuild.runners.common import pointer_table
    stacked = [torch.zeros(5, 3, 7, dtype=torch.bfloat16), torch.zeros(5, 11, dtype=torch.int32)]
    table = pointer_table(stacked, 4)                  # fewer sets than stacked is fine
    assert len(table) == 4 * 2
    assert list(table) == [t[j].data_ptr() for j in range(4) for t in stacked]


def test_warm_up_lasts_the_floor_even_when_the_first_round_is_slow(monkeypatch):
    # a slow first round (a graph's upload) must not set the count: warm-up goes on until
    # MIN_WARMUP_S has passed; a step slower than the floor still runs `rounds` times.
    # The clock is the steps' own (each step advances it), so the load on the machine
    # running the test cannot change what is counted.
    from mpkbuild.runners import timing
    clock = [0.0]
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    calls = []

    def step(seconds):
        def run():
            calls.append(clock[0])
            clock[0] += seconds(len(calls))
        return run

    timing.warm_up([step(lambda n: 0.020 if n == 1 else 0.0005)], rounds=1)
    assert clock[0] >= timing.MIN_WARMUP_S
    assert len(calls) >= 1 + 10          # 20 ms, then 0.5 ms steps up to the 25 ms floor
    calls.clear()
    clock[0] = 0.0
    timing.warm_up([step(lambda n: 0.03)], rounds=3)
    assert len(calls) == 3


def test_a_loaded_baseline_is_an_importable_module(tmp_path):
    """torch.compile resolves a function's module by name: load_function must register it."""
    import sys
    from mpkbuild.runners.common import load_function
    (tmp_path / "ref.py").write_text("def double(x):\n    return 2 * x\n")
    fn = load_function(str(tmp_path), "ref.py:double")
    assert fn(3) == 6 and sys.modules[fn.__module__].double is fn
