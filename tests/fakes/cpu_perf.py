"""runners/perf.py on the CPU, for tests of what the perf runner times and how it picks."""


def cpu_perf(monkeypatch, torch, time_graphs=None, launch=None):
    """runners/perf.py on the CPU: every CUDA step (capture, replay, slowCTA, pointer
    tables, torch.compile) replaced by a recorder; what is timed is what it asks for.
    `time_graphs` replaces the fixed-figure timer (it may call the enqueues it gets, which
    call `launch`); `seen["timed"]` then records only what the fixed one records."""
    from types import SimpleNamespace
    from mpkbuild.runners import perf
    seen = {"loaded": [], "compiled": [], "timed": [], "slowcta": 0}

    class CpuTorch:
        def __getattr__(self, name):
            return getattr(torch, name)
        Generator = staticmethod(lambda device=None: torch.Generator())
        empty = staticmethod(lambda shape, dtype=None, device=None: torch.empty(shape, dtype=dtype))
        cuda = SimpleNamespace(synchronize=lambda: None)
        _dynamo = SimpleNamespace(reset=lambda: None)

        @staticmethod
        def compile(fn, dynamic=False, mode=None):
            seen["compiled"].append(fn)
            return fn

    def fixed_times(graphs, launches, repeats, warmup, prime=False, sampling=None, nvml=None):
        for enqueue in graphs:            # each "graph" is its enqueue: run it once
            enqueue(1, None)
        seen["timed"].append({"graphs": len(graphs), "prime": prime})
        return [{"median_us": 1.0 + i, "samples_us": [(1.0 + i) * (1 + 0.001 * j) for j in range(repeats)]}
                for i in range(len(graphs))]

    def slow_cta(*args):
        seen["slowcta"] += 1
        return {}

    def load_function(root, ref):
        seen["loaded"].append(ref)
        return lambda *tensors, **params: None

    if launch is None:
        launch = lambda inputs, outputs, spans=None, stream=None: None
    launch.sets = lambda table, nsets, count, stream: None
    monkeypatch.setattr(perf, "torch", CpuTorch())
    monkeypatch.setattr(perf, "capture", lambda enqueue, launches: enqueue)
    monkeypatch.setattr(perf, "time_graphs", time_graphs or fixed_times)
    monkeypatch.setattr(perf, "slow_cta", slow_cta)
    monkeypatch.setattr(perf, "pointer_table", lambda stacked, count: None)
    monkeypatch.setattr(perf, "load_function", load_function)
    monkeypatch.setattr(perf, "_sets", lambda specs, gens, count, gen: [torch.zeros((count, 2)) for _ in specs])
    harness = SimpleNamespace(launcher=lambda variant: launch)
    return perf, harness, seen
