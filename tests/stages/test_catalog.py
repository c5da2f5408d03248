"""The kernel catalog on a CPU machine: every spec loads, every kernel (and every family's
scaffold) generates and compiles for both archs through real scons with a clean resource
gate, and the torch references say what the specs promise (ties, out-of-range ids).

The compile check is ONE `scons -j2 stage=compile` over every kernel in a module-scoped
copy (CI has 2 cores), with the five scaffold starters added to the same build."""
import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, copy_project
from mpkbuild import scaffold
from mpkbuild.model.kernel import discover
from mpkbuild.stages import load_spec

CATALOG = ("silu_mul_v2", "embedding_v2", "argmax_v2", "argmax_fp32_v2", "linear_v2", "linear_residual_v2")
STARTERS = {f"starter_{f.lower()}": f for f in "ABCDE"}
ARCHS = ("sm_90a", "sm_100a")


def _module(kernel: str):
    """The kernel's reference module, found through its spec (argmax_fp32_v2 shares one)."""
    ref = load_spec(REPO / "specs" / f"{kernel}.yaml", REPO).data["validate"]["reference"]
    path = REPO / ref.rsplit(":", 1)[0]
    spec = importlib.util.spec_from_file_location(f"catalog_ref_{kernel}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- specs
def test_catalog_is_discovered():
    assert set(CATALOG) <= set(discover(REPO))


@pytest.mark.parametrize("kernel", discover(REPO))
def test_every_spec_loads(kernel):
    spec = load_spec(REPO / "specs" / f"{kernel}.yaml", REPO)
    assert spec.name == kernel
    assert set(spec.data["archs"]) == set(ARCHS)
    names = spec.data["codegen"]["variants"]
    assert any(n.startswith("large_") for n in names) and any(n.startswith("decode_") for n in names)
    assert spec.data["perf"]["thresholds"], "a catalog kernel states its perf targets"


def test_argmax_compares_exactly():
    spec = load_spec(REPO / "specs" / "argmax_v2.yaml", REPO)
    assert spec.data["validate"]["compare"] == "exact"
    assert [r["name"] for r in spec.data["codegen"]["smem"]["regions"]] == ["ring", "warp_best"]


def test_argmax_fp32_is_argmax_v2s_body_over_fp32():
    bf16 = load_spec(REPO / "specs" / "argmax_v2.yaml", REPO).data
    fp32 = load_spec(REPO / "specs" / "argmax_fp32_v2.yaml", REPO).data
    assert fp32["codegen"]["body"] == bf16["codegen"]["body"]
    assert fp32["validate"]["reference"] == bf16["validate"]["reference"]
    assert fp32["validate"]["compare"] == "exact"
    assert [t["dtype"] for t in fp32["codegen"]["inputs"]] == ["fp32"]
    assert set(fp32["codegen"]["variants"]) == set(bf16["codegen"]["variants"])


def test_argmax_fp32_generator_ties_the_row_maximum():
    """fp32 draws are all distinct in practice; the spec's step makes the lowest-index rule
    meet ties (what the GPU gate then checks exactly)."""
    from mpkbuild.runners.common import random_tensor
    gen = load_spec(REPO / "specs" / "argmax_fp32_v2.yaml", REPO).data["generators"]["logits"]
    rows = random_tensor((256, 129280), torch.float32, gen, torch.Generator().manual_seed(7),
                         device="cpu")
    step = gen["step"]
    assert torch.equal(rows, torch.round(rows / step) * step)
    tied = (rows == rows.max(dim=1, keepdim=True).values).sum(dim=1) > 1
    assert 0.02 < tied.float().mean().item() < 0.2
    unrounded = {k: v for k, v in gen.items() if k != "step"}
    plain = random_tensor((256, 129280), torch.float32, unrounded, torch.Generator().manual_seed(7),
                          device="cpu")
    assert int(((plain == plain.max(dim=1, keepdim=True).values).sum(dim=1) > 1).sum()) == 0


def test_embedding_generator_draws_out_of_range_ids_on_both_sides():
    data = load_spec(REPO / "specs" / "embedding_v2.yaml", REPO).data
    gen, vocab = data["generators"]["ids"], data["codegen"]["params"]["vocab"]
    assert gen["dist"] == "randint" and gen["low"] < 0 and gen["high"] > vocab
    # enough of them that a 16-row variant meets one in practice (P(miss) < 3% per trial)
    out_frac = (-gen["low"] + gen["high"] - vocab) / (gen["high"] - gen["low"])
    assert (1 - out_frac) ** 16 < 0.03


def test_embedding_is_timed_on_in_range_ids_only():
    """validate's out-of-range ids test the zero-row rule; perf times what decode sends."""
    from mpkbuild.runners.perf import timed_generators
    data = load_spec(REPO / "specs" / "embedding_v2.yaml", REPO).data
    gens = timed_generators({"generators": {"generators": data["generators"]},
                             "perf": {"perf": data["perf"]}})
    vocab = data["codegen"]["params"]["vocab"]
    assert (gens["ids"]["low"], gens["ids"]["high"]) == (0, vocab)
    assert gens["table"] == data["generators"]["table"]
    assert data["generators"]["ids"]["low"] < 0          # validate's own are untouched


# ---------------------------------------------------------------- one real build
@pytest.fixture(scope="module")
def catalog_build(tmp_path_factory):
    proj = copy_project(tmp_path_factory.mktemp("catalog") / "proj", kernels=None)
    for name, family in STARTERS.items():
        scaffold.create(proj.root, name, family)
    run = proj.scons("-j2", "stage=compile", check=False, timeout=1800)
    return proj, run


@pytest.mark.nvcc
def test_one_build_compiles_everything(catalog_build):
    proj, run = catalog_build
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    for kernel in (*discover(REPO), *STARTERS):
        for arch in ARCHS:
            assert f"compile {kernel} {arch}" in run.actions, (kernel, arch)


@pytest.mark.nvcc
@pytest.mark.parametrize("kernel", CATALOG + tuple(STARTERS))
@pytest.mark.parametrize("arch", ARCHS)
def test_resources_pass_without_spills(catalog_build, kernel, arch):
    proj, _ = catalog_build
    res_file = proj.root / "build" / kernel / arch / "resources.json"
    assert res_file.is_file(), f"{kernel} {arch} did not compile (see {res_file.parent}/compile.log)"
    res = json.loads(res_file.read_text())
    variants = load_spec(proj.root / "specs" / f"{kernel}.yaml", proj.root).data["codegen"]["variants"]
    assert res["verdict"] == "pass" and res["arch"] == arch, res["problems"]
    assert set(res["variants"]) == set(variants)
    for name, v in res["variants"].items():
        assert v["spill_stores"] == v["spill_loads"] == 0, (name, v)
        assert 0 < v["registers"] <= 255 and v["stack"] == 0, (name, v)
        assert v["smem_total"] <= 224256
    assert (proj.root / "build" / kernel / arch / f"lib{kernel}.so").stat().st_size > 0


@pytest.mark.nvcc
def test_scaffolded_kernels_are_ordinary_kernels(catalog_build):
    proj, _ = catalog_build
    for name in STARTERS:
        header = (proj.root / "build" / name / "gen" / f"{name}_spec.h").read_text()
        assert "constexpr float SCALE = 0.5f;" in header
    a = (proj.root / "build" / "starter_a" / "gen" / "starter_a_spec.h").read_text()
    # family A is a declared pipeline: its ring, barriers and their audit in the header
    assert "SMEM_RING_OFFSET" in a and "struct ring {" in a and "static_assert(FULL_TX_BYTES == COPY_TILE_BYTES" in a
    assert "SMEM_TILE_OFFSET" in (proj.root / "build" / "starter_b" / "gen" / "starter_b_spec.h").read_text()


@pytest.mark.nvcc
def test_gates_go_validates_first_then_the_longest_by_their_last_time(catalog_build):
    """-j1 over the whole catalog: every validate before any perf, and among each gate kind
    the one that took longest last time first (the scaffolded kernels are in the build too)."""
    proj, run = catalog_build
    assert run.returncode == 0
    kernels = (*discover(REPO), *STARTERS)
    took = {k: float(i) for i, k in enumerate(kernels)}     # the last one took longest

    def gates_run(env: dict) -> list[tuple[str, str]]:
        proj.runs_file.write_text("")
        proj.scons("-j1", "stage=perf", env=env, timeout=900)
        lines = [line.split() for line in proj.runs_file.read_text().splitlines()]
        return [(gate, kernel) for gate, kernel in lines if gate in ("validate", "perf")]

    order = gates_run({"FAKE_GPU_ELAPSED": json.dumps(took)})
    assert [g for g, _ in order] == ["validate"] * len(kernels) + ["perf"] * len(kernels)
    for ref in proj.root.glob("kernels/*/reference*.py"):    # argmax_fp32_v2 reads argmax_v2's
        proj.edit(str(ref.relative_to(proj.root)), "\n", "\n# edited: validate and perf re-run\n")
    order = gates_run({})
    longest_first = sorted(kernels, key=lambda k: -took[k])
    assert [g for g, _ in order] == ["validate"] * len(kernels) + ["perf"] * len(kernels)
    assert [k for g, k in order if g == "validate"] == longest_first
    assert [k for g, k in order if g == "perf"] == longest_first


# ---------------------------------------------------------------- references (CPU)
def test_silu_mul_reference_matches_torch():
    mod = _module("silu_mul_v2")
    x = torch.randn(4, 2, 256, dtype=torch.bfloat16)
    ref = mod.silu_mul_reference(x.double())
    base = mod.torch_silu_mul(x)
    assert ref.shape == (4, 256) and base.shape == (4, 256)
    assert torch.allclose(base.double(), ref, rtol=2e-2, atol=2e-2)
    flat = x.reshape(4, 512)   # the [rows, 2*inter] tensor it really is
    assert torch.allclose(ref, (F.silu(flat[:, :256].double()) * flat[:, 256:].double()))


def test_embedding_reference_writes_zero_rows_for_out_of_range_ids():
    mod = _module("embedding_v2")
    table = torch.randn(100, 64, dtype=torch.bfloat16)
    ids = torch.tensor([0, 99, -1, 100, 5, -2147483648, 2147483647, 42], dtype=torch.int32)
    ref = mod.embedding_reference(ids.double(), table.double())
    valid = (ids >= 0) & (ids < 100)
    assert torch.equal(ref[valid], table.double()[ids[valid].long()])
    assert bool((ref[~valid] == 0).all()) and int((~valid).sum()) == 4
    base = mod.torch_embedding(ids, table)   # clamps, so it survives the bad ids
    assert torch.equal(base[valid], table[ids[valid].long()])


def test_argmax_reference_ties_go_to_the_lowest_index_and_nan_is_max():
    mod = _module("argmax_v2")
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0],
                      [-0.0, 0.0, -1.0, -2.0, -3.0],
                      [1.0, float("nan"), 5.0, float("nan"), 0.0],
                      [float("-inf")] * 5], dtype=torch.bfloat16)
    want = torch.tensor([1, 0, 1, 0])
    assert torch.equal(mod.argmax_reference(x.double()), want)
    assert torch.equal(mod.torch_argmax(x), want)
    # random bf16 rows tie often; upcasting to float64 keeps every tie
    r = torch.randn(64, 32000).to(torch.bfloat16)
    assert torch.equal(mod.argmax_reference(r.double()), torch.argmax(r.float(), dim=-1))


def test_linear_reference_matches_torch():
    mod = _module("linear_v2")
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    w = (torch.randn(64, 512) * 0.02).to(torch.bfloat16)
    ref = mod.linear_reference(x.double(), w.double())
    assert ref.shape == (3, 64)
    assert torch.allclose(mod.torch_linear(x.float(), w.float()).double(), ref, rtol=1e-4, atol=1e-5)


def test_kernels_of_different_ops_read_different_reference_files():
    """validate, perf and the tune key sign a reference file whole: two ops in one file would
    re-run (and stale the tuned file of) one op's kernels when the other's definition changes."""
    op_of_file: dict[str, set[str]] = {}
    for path in sorted((REPO / "specs").glob("*.yaml")):
        data = load_spec(path, REPO).data
        for fn in (data["validate"]["reference"], data["perf"]["baseline"]):
            op_of_file.setdefault(fn.rsplit(":", 1)[0], set()).add(data["op"])
    shared = {f: ops for f, ops in op_of_file.items() if len(ops) > 1}
    assert not shared, f"one reference file holds several ops: {shared}"
    assert len(op_of_file) >= 9
