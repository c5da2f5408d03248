"""codegen.pipeline (issue 55 items 1-2): a warp-role pipeline declared in the spec, its
protocol audited before any GPU, rendered into the spec header as constants, static_asserts
and helpers that compile for sm_90a and sm_100a. Each fault fixture is refused on the CPU with
its location (the spec's file, line and field, or the body's line) and nothing is compiled."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, Project
from mpkbuild.model.spec import SpecError
from mpkbuild.stages import load_spec

FIXTURE = REPO / "tests" / "fixtures" / "pipeline"
SPEC = "specs/pipe_copy.yaml"
BODY = "kernels/pipe_copy/pipe_copy.cuh"


def fixture_project(dest: Path, kernel: str = "pipe_copy") -> Project:
    """The project's tool with one pipeline fixture (pipe_copy, or pipe_tma) as its only kernel."""
    dest.mkdir(parents=True)
    for name in ("SConstruct", "site_scons", "pyproject.toml"):
        src = REPO / name
        (shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
         if src.is_dir() else shutil.copy2(src, dest / name))
    (dest / "specs").mkdir()
    shutil.copy2(FIXTURE / "specs" / f"{kernel}.yaml", dest / "specs")
    shutil.copytree(FIXTURE / "kernels" / kernel, dest / "kernels" / kernel,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return Project(dest)


def refused(tmp_path: Path, old: str, new: str, spec_rel: str = SPEC) -> SpecError:
    """The fixture spec with one edit, loaded: the error it is refused with."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURE, root)
    spec = root / spec_rel
    text = spec.read_text()
    for a, b in zip(*((old, new) if isinstance(old, tuple) else ((old,), (new,)))):
        assert a in text, a
        text = text.replace(a, b, 1)
    spec.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(spec, root)
    return info.value


def test_the_fixture_declares_a_pipeline_the_audit_accepts():
    data = load_spec(FIXTURE / SPEC, FIXTURE).data["codegen"]["pipeline"]
    assert [r["name"] for r in data["roles"]] == ["producer", "consumer"]
    assert data["mbarriers"][0]["per_stage"] is True and data["semaphores"] == 0


# (what breaks, the edit, the field it is named by, words of the message)
SPEC_FAULTS = [
    ("wrong arrive count", "arrivals: 3, wait: [producer]", "arrivals: 2, wait: [producer]",
     ("codegen", "pipeline", "mbarriers", 1, "arrivals"), "a lane per warp (3)"),
    ("tx-bytes off by one tile", "tx_bytes: tile * cols * 4", "tx_bytes: 2 * tile * cols * 4",
     ("codegen", "pipeline", "mbarriers", 0, "tx_bytes"), "would never complete"),
    ("re-initialised by a role that does not arrive on it",
     "tx_bytes: tile * cols * 4, wait: [consumer]}", "tx_bytes: tile * cols * 4, wait: [consumer], init: consumer}",
     ("codegen", "pipeline", "mbarriers", 0, "init"), "must re-initialise it at task start"),
    ("roles that do not cover the body's threads", "{name: consumer, warps: 3}", "{name: consumer, warps: 2}",
     ("codegen", "pipeline", "roles"), "every body thread needs exactly one role"),
    ("a wait on a role that does not exist", "wait: [consumer]}", "wait: [loader]}",
     ("codegen", "pipeline", "mbarriers", 0, "wait"), "no role 'loader'"),
    ("a copy completing on a barrier without transaction bytes", "barrier: full}", "barrier: empty}",
     ("codegen", "pipeline", "copies", 0, "barrier"), "not a transaction-counted mbarrier"),
    ("a ring the body's instantiation cannot know", "steps: steps}", "steps: rows // (tile * 4)}",
     ("codegen", "pipeline", "ring", "steps"), "not one of codegen.template_params"),
    ("mbarriers that do not fit their region", "{name: mbarriers, bytes: 128, align: 8}",
     "{name: mbarriers, bytes: 32, align: 8}", ("codegen", "smem", "regions", 0, "bytes"), "need 48 bytes"),
    ("a copy that is not whole 16-byte units", "{name: tile, bytes: tile * cols * 4,",
     "{name: tile, bytes: tile * cols * 4 + 4,", ("codegen", "pipeline", "copies", 0, "bytes"),
     "not a multiple of 16"),
    ("more op-private semaphores than a task may take", "named_barriers:", "semaphores: 32\n    named_barriers:",
     ("codegen", "pipeline", "semaphores"), "32"),
]


@pytest.mark.parametrize("what,old,new,path,words", SPEC_FAULTS, ids=[f[0] for f in SPEC_FAULTS])
def test_a_protocol_fault_is_refused_at_its_field(tmp_path, what, old, new, path, words):
    err = refused(tmp_path, old, new)
    assert err.path == path, (what, err)
    assert words in err.message, (what, err.message)
    assert err.file == SPEC and err.line > 1
    lines = (tmp_path / "tree" / SPEC).read_text().splitlines()
    assert path[-1] in lines[err.line - 1] or str(path[-1]).isdigit() or path[-1] == "roles", \
        (what, err.line, lines[err.line - 1])


TMA_SPEC = "specs/pipe_tma.yaml"
# TMA faults (pipe_tma): each would hang the task (tx bytes never arriving), fault the copy
# (a box the hardware refuses, SMEM it cannot write at the swizzle) or give the runtime's
# tma.cuh case a box it cannot compute
TMA_FAULTS = [
    ("tx-bytes that are not the box's", "tx_bytes: box_rows * box_cols * 2", "tx_bytes: box_rows * box_cols * 4",
     ("codegen", "pipeline", "mbarriers", 0, "tx_bytes"), "move 4096: the phase would never complete"),
    ("a box row wider than its swizzle", "swizzle: 128,", "swizzle: 64,",
     ("codegen", "pipeline", "copies", 0, "box"), "128 bytes, wider than the 64-byte swizzle span"),
    ("a box dim past 256", "box: [box_rows, box_cols]", "box: [box_rows * 16, box_cols]",
     ("codegen", "pipeline", "copies", 0, "box"), "box[0] = 512: a TMA box dim is at most 256"),
    ("a ring region TMA cannot write at the swizzle", "box_cols * 2, align: 1024}", "box_cols * 2, align: 128}",
     ("codegen", "smem", "regions", 1, "align"), "lands at a multiple of 1024"),
    ("a box written in the variant's symbols", "box: [box_rows, box_cols]", "box: [box_rows * bands, box_cols]",
     ("codegen", "pipeline", "copies", 0, "box", 0), "all the checkout's tma.cuh case sees"),
    ("a tensor copy with bytes of its own", "tensor: x, box:", "tensor: x, bytes: 4096, box:",
     ("codegen", "pipeline", "copies", 0, "bytes"), "its bytes are the box's"),
    ("a box of a tensor that is no input", "tensor: x,", "tensor: y,",
     ("codegen", "pipeline", "copies", 0, "tensor"), "no codegen input 'y'"),
    ("a box of a dtype the checkout cannot map", "{name: x, dtype: bf16,", "{name: x, dtype: fp32,",
     ("codegen", "pipeline", "copies", 0, "tensor"), "makes 2-d bf16 maps"),
    ("a ring region too small for its stages", "bytes: stages * box_rows * box_cols * 2,",
     "bytes: 2 * box_rows * box_cols * 2,", ("codegen", "smem", "regions", 1, "bytes"),
     "3 stages of the copies landing in ring need 12288 bytes"),
    # a 4-row box of 512 bytes, 128-byte swizzled, takes a whole 1024-byte pattern a stage
    ("a ring region sized by a box short of its swizzle pattern",
     ("box_cols: 64 ", "box: [box_rows,", "tx_bytes: box_rows *", "bytes: stages * box_rows *"),
     ("box_cols: 64\n    few: 4 ", "box: [few,", "tx_bytes: few *", "bytes: stages * few *"),
     ("codegen", "smem", "regions", 1, "bytes"), "3 stages of the copies landing in ring need 3072 bytes, the region has 1536"),
    ("ring stages that do not keep TMA's alignment",
     ("box_cols: 64 ", "box: [box_rows,", "swizzle: 128,", "tx_bytes: box_rows *"),
     ("box_cols: 8\n    few: 4 ", "box: [few,", "swizzle: 0,", "tx_bytes: few *"),
     ("codegen", "smem", "regions", 1, "bytes"), "stage 1 lands at 64, not a multiple of 128"),
    ("a tensor copy without its region", ", region: ring, barrier: full}", ", barrier: full}",
     ("codegen", "pipeline", "copies", 0), "needs its region"),
    # a fill of two boxes moves twice one box's bytes: the tx bytes must count both
    ("a fill of two boxes the tx bytes count once", "swizzle: 128, region: ring,",
     "boxes: 2, swizzle: 128, region: ring,", ("codegen", "pipeline", "mbarriers", 0, "tx_bytes"),
     "expects 4096 transaction bytes per phase, and the copies completing on it move 8192"),
    ("boxes written in a symbol the variant lacks", "swizzle: 128, region: ring,",
     "boxes: fills, swizzle: 128, region: ring,", ("codegen", "pipeline", "copies", 0, "boxes"),
     "fills"),
]


def test_the_tma_fixture_declares_a_box_the_audit_accepts():
    data = load_spec(FIXTURE / TMA_SPEC, FIXTURE).data["codegen"]["pipeline"]
    assert data["copies"][0]["tensor"] == "x" and data["copies"][0]["box"] == ["box_rows", "box_cols"]


@pytest.mark.parametrize("what,old,new,path,words", TMA_FAULTS, ids=[f[0] for f in TMA_FAULTS])
def test_a_tma_fault_is_refused_at_its_field(tmp_path, what, old, new, path, words):
    err = refused(tmp_path, old, new, TMA_SPEC)
    assert err.path == path, (what, err)
    assert words in err.message, (what, err.message)
    assert err.file == TMA_SPEC and err.line > 1


def _generate(tmp_path: Path, body_old: str | None = None, body_new: str = "") -> tuple[Project, object]:
    p = fixture_project(tmp_path / "proj")
    if body_old is not None:
        p.edit(BODY, body_old, body_new)
    return p, p.scons("stage=generate", "kernel=pipe_copy", check=False)


# body faults: refused when the body is generated, named by its line; nothing is compiled
BODY_FAULTS = [
    ("missing re-init (begin never called)", "  R::begin(bars);\n", "", "never calls its ring's begin(bars)"),
    ("a hand-rolled init without the fence", "  R::begin(bars);\n",
     '  R::begin(bars);\n  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(0u));\n',
     "hand-rolled pipeline PTX"),
    ("an undeclared named barrier id", "      P::sync_consumers();",
     '      asm volatile("bar.sync 5, 96;");', "a named barrier of its own"),
]


@pytest.mark.parametrize("what,old,new,words", BODY_FAULTS, ids=[f[0] for f in BODY_FAULTS])
def test_a_body_that_breaks_the_protocol_is_refused_before_nvcc(tmp_path, what, old, new, words):
    p, run = _generate(tmp_path, old, new)
    assert run.returncode != 0, run.stdout
    assert words in run.stdout + run.stderr, (what, run.stdout, run.stderr)
    assert "build/pipe_copy/gen/pipe_copy.cuh" in run.stdout + run.stderr
    assert not (p.root / "build/pipe_copy/gen/pipe_copy.cuh").exists()
    assert not list((p.root / "build/pipe_copy").glob("sm_*/*.so"))


def test_a_named_barrier_id_the_checkout_uses_on_v2_is_refused(tmp_path):
    """The ids the header gives a pipeline's groups on Runtime-V2 are the tool's; a checkout
    whose v2 task uses one is refused naming both."""
    from mpkbuild.stages.generate import TemplateError
    from mpkbuild.stages.runtime import megakernel
    tasks = tmp_path / "co/include/mirage/persistent_kernel/tasks/blackwell_v2"
    tasks.mkdir(parents=True)
    (tasks / "theirs.cuh").write_text('asm volatile("bar.sync 8, 128;");\n')
    codegen = load_spec(FIXTURE / SPEC, FIXTURE).data["codegen"]
    with pytest.raises(TemplateError) as info:
        megakernel._check_v2(tmp_path / "co", "", "pipe_copy", codegen)
    assert "named barrier 8 is pipe_copy_spec::pipeline::sync_consumers() on Runtime-V2" in str(info.value)
    assert "theirs.cuh" in str(info.value)
    (tasks / "theirs.cuh").write_text('asm volatile("bar.sync 3, 128;");\n')
    megakernel._check_v2(tmp_path / "co", "", "pipe_copy", codegen)      # 3: not ours


@pytest.mark.nvcc
def test_the_rendered_helpers_compile_for_sm90a_and_sm100a(tmp_path):
    p = fixture_project(tmp_path / "proj")
    run = p.scons("stage=compile", "kernel=pipe_copy")
    for arch in ("sm_90a", "sm_100a"):
        assert f"compile pipe_copy {arch}" in run.stdout
        assert '"verdict": "pass"' in p.path(f"build/pipe_copy/{arch}/resources.json").read_text()
    header = p.path("build/pipe_copy/gen/pipe_copy_spec.h").read_text()
    assert "struct ring {" in header and "static_assert(FULL_TX_BYTES == COPY_TILE_BYTES" in header
    assert "constexpr int CONSUMERS_BARRIER_ID = 8;" in header     # v2's, and v1's below
    assert "constexpr int CONSUMERS_BARRIER_ID = 4;" in header
    # a protocol edit the audit accepts regenerates and recompiles, and -n says exactly that
    p.edit(SPEC, "tx_bytes: tile * cols * 4", "tx_bytes: cols * tile * 4")
    p.edit(SPEC, "{name: tile, bytes: tile * cols * 4,", "{name: tile, bytes: cols * tile * 4,")
    listed = set(p.scons("-n", "stage=compile", "kernel=pipe_copy").actions)
    done = set(p.scons("stage=compile", "kernel=pipe_copy").actions)
    assert listed == done and {"compile pipe_copy sm_90a", "compile pipe_copy sm_100a"} <= done, (listed, done)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_pipeline_fixture_passes_validate_on_the_gpu(tmp_path):
    """The helpers do what they say on the GPU: the ring copies every row, in the harness and
    in worker mode (several tasks per block, the mbarriers re-initialised by each)."""
    p = fixture_project(tmp_path / "proj")
    run = p.scons("stage=validate", "kernel=pipe_copy", fake_gpu=False, timeout=900)
    assert "validate pipe_copy" in run.stdout
    (result,) = (p.root / "build/pipe_copy/gpu").glob("*/validate.json")
    assert json.loads(result.read_text())["verdict"] == "pass"


@pytest.mark.nvcc
def test_the_tma_helpers_and_maps_compile_for_sm90a_and_sm100a(tmp_path):
    """The box copy, the map's constants and the harness's per-task maps compile on both
    archs; the ring's box bytes are the header's, asserted against the barrier's."""
    p = fixture_project(tmp_path / "proj", "pipe_tma")
    run = p.scons("stage=compile", "kernel=pipe_tma")
    for arch in ("sm_90a", "sm_100a"):
        assert f"compile pipe_tma {arch}" in run.stdout
        assert '"verdict": "pass"' in p.path(f"build/pipe_tma/{arch}/resources.json").read_text()
    header = p.path("build/pipe_tma/gen/pipe_tma_spec.h").read_text()
    assert "struct tma_x {" in header and "static_assert(FULL_TX_BYTES == COPY_BOX_BYTES" in header
    harness = p.path("build/pipe_tma/gen/harness.cu").read_text()
    # a tensor copy's dimensionality is its map's rank (a 2-d copy of MPK's rank-5 map is an
    # illegal instruction on the GPU: seen on an H100, 2026-12-05)
    import re
    rank = int(re.search(r"encode\(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (\d+),", harness).group(1))
    assert rank == 5 and re.findall(r"cp\.async\.bulk\.tensor\.(\d)d", header) == [str(rank)]
    assert "x_tmaps + task," in harness and "pipe_tma_maps_r512_c192(inputs, maps" in harness


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_tma_fixture_passes_validate_on_the_gpu(tmp_path):
    """TMA as the spec declares it on the GPU: every task's box lands where the body reads it
    (the 128-byte swizzle undone as the map's says), in the harness and in worker mode."""
    p = fixture_project(tmp_path / "proj", "pipe_tma")
    run = p.scons("stage=validate", "kernel=pipe_tma", fake_gpu=False, timeout=900)
    assert "validate pipe_tma" in run.stdout
    (result,) = (p.root / "build/pipe_tma/gpu").glob("*/validate.json")
    assert json.loads(result.read_text())["verdict"] == "pass"


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_tma_linear_passes_validate_on_the_gpu(tmp_path):
    """linear_v2, the pipeline exemplar (issue 58): every decode shape against the float64
    reference, in the harness and in worker mode, through the maps the harness makes."""
    from conftest import copy_project
    # every kernel: its spec's MLP block (runtime.blocks) names four of them
    p = copy_project(tmp_path / "proj", kernels=None)
    p.scons("stage=validate", "kernel=linear_v2", fake_gpu=False, timeout=1200)
    (result,) = (p.root / "build/linear_v2/gpu").glob("*/validate.json")
    assert json.loads(result.read_text())["verdict"] == "pass"


# variants that take the TMA linears' wider fills (nf W boxes of one k a fill): nf 4 puts four
# accumulators side by side in sm_100a's TMEM (rmsnorm_linear_v2's m16 variant takes nf 4
# in the spec itself)
WIDE_FILLS = {
    "linear_v2": {"decode_m16_n14336_k4096": "nt: 128, stages: 6,  kf: 1, nf: 2",
                  "decode_m16_n28672_k4096": "nt: 256, stages: 4,  kf: 1, nf: 4",
                  # one task a worker at n28672: 224 rows, seven 32-row boxes a k box
                  "decode_m8_n28672_k4096": "nt: 224, stages: 4,  kf: 4, nf: 1",
                  "decode_m1_n28672_k4096": "nt: 224, stages: 4,  kf: 1, nf: 7"},
}


def wide_fills_project(dest: Path) -> Project:
    """The catalog with WIDE_FILLS' variants edited in their specs."""
    import re
    from conftest import copy_project
    p = copy_project(dest, kernels=None)
    for kernel, variants in WIDE_FILLS.items():
        spec = p.root / "specs" / f"{kernel}.yaml"
        text = spec.read_text()
        for variant, values in variants.items():
            text, n = re.subn(rf"^(    {variant}: .*?)nt: +\d+, +stages: \d+, +kf: \d+, nf: \d+}}$",
                              rf"\g<1>{values}}}", text, flags=re.M)
            assert n == 1, (kernel, variant)
        spec.write_text(text)
    return p


@pytest.mark.nvcc
def test_wider_fills_compile_for_sm90a_and_sm100a(tmp_path):
    """nf passes the pipeline audit (a fill's boxes, its tx bytes, the ring's room) and the
    body's static_asserts, and compiles on both archs without spills."""
    p = wide_fills_project(tmp_path / "proj")
    p.scons("stage=compile", f"kernel={','.join(WIDE_FILLS)}", timeout=1200)
    for kernel, variants in WIDE_FILLS.items():
        header = p.path(f"build/{kernel}/gen/{kernel}_spec.h").read_text()
        assert "static constexpr int COPY_W_BOXES = (kf * nf);" in header
        # nt 224 (an odd multiple of 32) takes 32-row boxes: a fill of kf x nf of them
        assert "(BOX_N - (nt % BOX_N))" in header
        for arch in ("sm_90a", "sm_100a"):
            res = json.loads(p.path(f"build/{kernel}/{arch}/resources.json").read_text())
            assert res["verdict"] == "pass", res["problems"]
            for variant in variants:
                assert res["variants"][variant]["spill_stores"] == 0, (kernel, arch, variant)


@pytest.mark.nvcc
def test_the_silu_epilogue_pairs_gate_and_up_boxes_and_compiles_for_sm90a_and_sm100a(tmp_path):
    """rmsnorm_linear_silu_mul_v2: every task gets all of W (one map, 64-row boxes), a fill
    holds its gate boxes then the same up rows N/2 on (found from task_index), and y is N/2
    wide; the audit passes, and both archs compile without spills."""
    from conftest import copy_project
    kernel = "rmsnorm_linear_silu_mul_v2"
    p = copy_project(tmp_path / "proj", kernels=None)
    p.scons("stage=compile", f"kernel={kernel}", timeout=1200)
    body = p.path(f"build/{kernel}/gen/{kernel}.cuh").read_text()
    assert "(nb / (NF / 2)) * (N / 2) + wrow" in body and "task_index * (NT / 2)" in body
    assert "box_rows(N, K)" in body and "(void)task_index;" not in body
    harness = p.path(f"build/{kernel}/gen/harness.cu").read_text()
    assert "tma_weight::box_rows(28672, 4096)" in harness      # the map over all of W
    assert "y + static_cast<size_t>(task) * 128ull" in harness    # NT / 2 columns of y a task
    for arch in ("sm_90a", "sm_100a"):
        res = json.loads(p.path(f"build/{kernel}/{arch}/resources.json").read_text())
        assert res["verdict"] == "pass", res["problems"]
        assert all(v["spill_stores"] == 0 for v in res["variants"].values()), (arch, res["variants"])


@pytest.mark.gpu
@pytest.mark.nvcc
def test_wider_fills_pass_validate_on_the_gpu(tmp_path):
    """The same variants (and rmsnorm_linear_v2's) against the float64 reference, in the
    harness and in worker mode: a fill's rows span several boxes, and the mma warps' tiles
    and the epilogue's rows follow them."""
    p = wide_fills_project(tmp_path / "proj")
    kernels = [*WIDE_FILLS, "rmsnorm_linear_v2"]
    p.scons("stage=validate", f"kernel={','.join(kernels)}", fake_gpu=False, timeout=1500)
    for kernel in kernels:
        result = p.gate_result(kernel, "validate")
        assert result["verdict"] == "pass", (kernel, result["message"])


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_family_a_starter_passes_validate_on_the_gpu(tmp_path):
    """`scons new=K family=A` starts from a declared pipeline of pipe_copy's shape: it passes
    validate as scaffolded, in the harness and in worker mode."""
    from conftest import copy_project
    from mpkbuild import scaffold
    p = copy_project(tmp_path / "proj", kernels=())
    scaffold.create(p.root, "starter_a", "A")
    p.scons("stage=validate", "kernel=starter_a", fake_gpu=False, timeout=900)
    (result,) = (p.root / "build/starter_a/gpu").glob("*/validate.json")
    assert json.loads(result.read_text())["verdict"] == "pass"


# a fault no static audit sees: the consumers never hand stage 0 back, so the producer waits
# forever once the ring wraps (8 steps on 3 stages); it generates and compiles as any body does
NEVER_ARRIVES = ("if (P::lane() == 0) P::arrive(", "if (P::lane() == 0 && s != 0) P::arrive(")


@pytest.mark.nvcc
def test_a_role_that_never_arrives_at_runtime_is_no_fault_the_cpu_can_see(tmp_path):
    """It passes generate and compile: only validate or the runtime gate can catch it (below)."""
    p = fixture_project(tmp_path / "proj")
    p.edit(BODY, *NEVER_ARRIVES)
    p.scons("stage=compile", "kernel=pipe_copy")
    assert '"verdict": "pass"' in p.path("build/pipe_copy/sm_90a/resources.json").read_text()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_role_that_never_arrives_hangs_within_the_watchdog_and_the_gpu_stays_usable(tmp_path):
    """validate's verdict is `hang` inside its watchdog (the process group killed), never a
    wedged call; the mended body's next validate on the same GPU passes."""
    import time
    p = fixture_project(tmp_path / "proj")
    p.edit(SPEC, "timeout_s: 120", "timeout_s: 20")
    p.edit(BODY, *NEVER_ARRIVES)
    started = time.monotonic()
    p.scons("stage=validate", "kernel=pipe_copy", fake_gpu=False, check=False, timeout=900)
    (result,) = (p.root / "build/pipe_copy/gpu").glob("*/validate.json")
    res = json.loads(result.read_text())
    assert res["verdict"] == "hang" and "ran past its 20 s timeout" in res["message"], res
    assert time.monotonic() - started < 300
    p.edit(BODY, NEVER_ARRIVES[1], NEVER_ARRIVES[0])
    p.scons("stage=validate", "kernel=pipe_copy", fake_gpu=False, timeout=900)
    assert json.loads(result.read_text())["verdict"] == "pass"


@pytest.mark.nvcc
def test_an_sm100a_kernel_waits_for_its_hardware_never_passed_never_an_error(tmp_path):
    """On a profile whose arch the spec does not target, every GPU gate is `pending TIER-1
    (needs sm_100a)` in status, -n, check, review and JUnit: not run, not passed, no error;
    the committed B200 profile makes the same gates ordinary pending ones on a CPU box."""
    import json
    p = fixture_project(tmp_path / "proj")
    p.edit(SPEC, "archs: [sm_90a, sm_100a]", "archs: [sm_100a]")
    h200 = "gpu=nvidia-h200-sm90"
    p.scons("stage=compile", "kernel=pipe_copy")
    nodes = {n["label"]: n for n in json.loads(p.scons("status", "--json", h200).stdout)["nodes"]}
    for gate in ("validate", "perf"):
        n = nodes[f"{gate} pipe_copy nvidia-h200-sm90"]
        assert n["state"] == "pending" and n["reasons"][0].startswith("pending TIER-1 (needs sm_100a)"), n
    assert not p.scons("-n", "stage=validate", h200).actions          # nothing it could run
    check = p.scons("check", h200)                                     # exit 0: waiting is no failure
    assert "2 gates wait for hardware" in check.stdout and "pending TIER-1 (needs sm_100a)" in check.stdout
    p.scons("stage=review", "kernel=pipe_copy", h200)
    review = p.path("build/pipe_copy/review.md").read_text()
    assert "## validate: pending TIER-1" in review and "Overall: **incomplete**" in review
    junit = p.path("build/pipe_copy/junit.xml").read_text()
    assert junit.count("<skipped") == 2 and "pending TIER-1 (needs sm_100a)" in junit and "<failure" not in junit
    b200 = {n["label"]: n for n in json.loads(p.scons("status", "--json", "gpu=nvidia-b200-sm100").stdout)["nodes"]}
    n = b200["validate pipe_copy nvidia-b200-sm100"]
    assert n["state"] == "pending" and not n["waits"] and "no GPU of this profile here" in n["reasons"][0]


def test_declaring_a_pipeline_regenerates_an_unchanged_body_and_checks_it(tmp_path):
    """The body's node reads the codegen section even for a plain (non-template) body: declaring
    codegen.pipeline must re-run the body's contract check, which a body that never calls
    begin(bars) then fails. (Without that edge the node was up to date, and under -j it could run
    before the spec node had written the section at all.)"""
    p = fixture_project(tmp_path / "proj")
    p.edit(BODY, "  R::begin(bars);\n", "")
    spec = p.root / SPEC
    text = spec.read_text()
    block = text[text.index("  pipeline:\n"):text.index("\ngenerators:")]
    spec.write_text(text.replace(block, ""))
    first = p.scons("stage=generate", "kernel=pipe_copy", check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    spec.write_text(text)
    again = p.scons("stage=generate", "kernel=pipe_copy", check=False)
    assert again.returncode != 0, again.stdout
    assert "never calls its ring's begin(bars)" in again.stdout + again.stderr
