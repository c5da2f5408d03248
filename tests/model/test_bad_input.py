"""The bad-input corpus: every hostile or broken spec is refused with one located message
`file:line: field: message`, fast and small, before anything is written.

Each case is a spec (or reference.py) edit. The loader is run in-process on every case
with a wall-clock timer and tracemalloc's peak; a representative subset also runs a real
`scons` in a project copy, asserting the exit status, the one stderr line, that build/
was never created, and the child's own time and peak RSS (os.wait4). The bounds are
generous ceilings so a loaded 2-core machine never flakes; the measured figures are in
bench/RESULTS.md.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import FAKES, copy_project
from mpkbuild.util import config
from mpkbuild.model.spec import SpecError
from mpkbuild.stages import load_spec
from mpkbuild.stages import load_kernel

K = "rmsnorm_v2"
SPEC = f"specs/{K}.yaml"
REF = f"kernels/{K}/reference.py"
CEILING_S = 10.0
CEILING_BYTES = 1 << 30


@dataclass(frozen=True)
class Case:
    mutate: Callable[[Path], None]
    path: str                  # the field path the message names ("<top>" for none)
    fragment: str              # words the message must contain
    line: str | int            # a needle on the expected line of the edited spec, or the line number
    prefix: bool = False       # the message's path starts with `path` (the item it names varies)


def replace(old: str, new: str):
    return with_bytes(old.encode(), new.encode())


def whole(content: str | bytes):
    def mutate(root: Path) -> None:
        p = root / SPEC
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return mutate


def with_bytes(old: bytes, new: bytes, rel: str = SPEC):
    def mutate(root: Path) -> None:
        p = root / rel
        raw = p.read_bytes()
        assert old in raw, old
        p.write_bytes(raw.replace(old, new, 1))
    return mutate


def chain(*mutates):
    def mutate(root: Path) -> None:
        for m in mutates:
            m(root)
    return mutate


# the large variants at row counts that hidden happens to divide: every listed variant splits
# evenly, and only a binding beyond them shows what is wrong
_SMALL_LARGE = (replace("{rows: 4096, hidden: 7168, rpt: 4}", "{rows: 4, hidden: 7168, rpt: 4}"),
                replace("{rows: 16384, hidden: 7168, rpt: 8}", "{rows: 16, hidden: 7168, rpt: 8}"))


def alias_bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [{','.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\n"


def many_variants(n: int):
    def mutate(root: Path) -> None:
        p = root / SPEC
        text = p.read_text()
        start = text.index("  variants:\n") + len("  variants:\n")
        end = text.index("  # every variant must satisfy")
        body = "".join(f"    v{i}: {{rows: 1, hidden: 4096, rpt: 1}}\n" for i in range(n))
        p.write_text(text[:start] + body + text[end:])
    return mutate


def nested(depth: int) -> str:
    return "description: " + "{a: " * depth + "1" + "}" * depth


CASES: dict[str, Case] = {
    # YAML structure
    "alias bomb (9 levels)": Case(whole(alias_bomb()), "a", "anchor &a is not allowed", 1),
    "anchor and alias": Case(replace("archs: [sm_90a, sm_100a]", "archs: &arch [sm_90a, sm_100a]\nop2: *arch"),
                             "archs", "anchor &arch", "archs: &arch"),
    "merge key": Case(replace("  threads: 128", "  <<: {threads: 128}"), "codegen.<<", "merge keys (<<) are not allowed", "<<:"),
    "unknown tag": Case(replace("  threads: 128", "  threads: !custom 128"), "codegen.threads",
                        "YAML tag '!custom' is not allowed", "threads: !custom"),
    "python tag": Case(replace("  threads: 128", "  threads: !!python/object/apply:os.system [ls]"),
                       "codegen.threads", "YAML tag", "threads: !!python"),
    "binary tag": Case(replace("description: RMSNorm", "description: !!binary aGVsbG8=\nx: RMSNorm"),
                       "description", "YAML tag", "description: !!binary"),
    "bad int under a plain tag": Case(replace("  threads: 128", "  threads: !!int many"), "codegen.threads",
                                      "cannot be read", "threads: !!int"),
    "implicit date": Case(replace("description: RMSNorm over the hidden dim, bf16 in/out, fp32 accumulation, "
                                  "128 threads per task.", "description: 2001-12-14"),
                          "description", "quote it", "description: 2001"),
    "5000-digit integer": Case(replace("{rows: 1, hidden: 4096, rpt: 1}", "{rows: " + "9" * 5000 + ", hidden: 4096, rpt: 1}"),
                               "codegen.variants.decode_r1_h4096.rows", "cannot be read", "decode_r1_h4096:"),
    "deeply nested mapping": Case(whole(nested(40)), "description.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a",
                                  f"nested deeper than {config.MAX_YAML_DEPTH}", 1),
    # libyaml's own nesting limit (1000) meets a flow list first
    "100,000-deep flow list": Case(whole("a: " + "[" * 100_000 + "]" * 100_000), "<top>",
                                   "exceeded maximum nesting depth", 1),
    "huge list": Case(replace("archs: [sm_90a, sm_100a]", "archs: [" + ",".join(["sm_90a"] * 30_000) + "]"),
                      "archs", f"more than {config.MAX_YAML_NODES} YAML nodes", "archs: [", prefix=True),
    # the root mapping, key and list are nodes 1-3, so the first node past the cap is item 19997
    "huge list alone": Case(whole("a: [" + "1," * 30_000 + "]"), "a.19997",
                            f"more than {config.MAX_YAML_NODES} YAML nodes", 1),
    "oversized file": Case(replace("# rmsnorm_v2:", "#" + "x" * config.MAX_SPEC_BYTES + "\n# rmsnorm_v2:"),
                           "<top>", f"more than the {config.MAX_SPEC_BYTES}", 1),
    "tab indentation": Case(replace("  threads: 128", "\tthreads: 128"), "<top>", "YAML syntax error",
                            "\tthreads: 128"),
    "duplicate key": Case(replace("  threads: 128", "  threads: 128\n  threads: 256"), "codegen.threads",
                          "duplicate key", "threads: 256"),
    "non-string key": Case(replace("  threads: 128", "  threads: 128\n  7: x"), "codegen",
                           "mapping key 7 is not a string", "  7: x"),
    "two documents": Case(replace("# rmsnorm_v2:", "a: 1\n---\n# rmsnorm_v2:"), "<top>", "YAML syntax error", "---"),
    "empty file": Case(whole(""), "<top>", "this one is empty", 1),
    "spec is a list": Case(whole("- kernel: rmsnorm_v2\n- op: rmsnorm\n"), "<top>", "this one is a YAML list", 1),
    "spec is a scalar": Case(whole("rmsnorm_v2\n"), "<top>", "this one is a YAML str", 1),
    "NUL byte": Case(with_bytes(b"  threads: 128", b"  threads: 1\x0028"), "<top>", "YAML syntax error",
                     "  threads: 1"),
    "non-UTF-8 spec": Case(with_bytes(b"# one fp32 partial per warp", b"# one fp32 partial \xff warp"),
                           "<top>", "not UTF-8 text: byte 0xff", "# one fp32 partial"),
    "non-UTF-8 reference.py": Case(with_bytes(b'"""', b'"""\xfe', rel=REF), "validate.reference",
                                   "reference.py:1 is not UTF-8 text (byte 0xfe)", "reference: kernels"),
    "reference.py with a NUL byte": Case(with_bytes(b'"""', b'"""\x00', rel=REF), "validate.reference",
                                         "does not parse", "reference: kernels"),
    # expressions
    "9 ** 9 ** 9": Case(replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}", 'bytes: "9 ** 9 ** 9"'),
                        "perf.bytes", "`**` is not supported", "bytes: \"9 **"),
    "** in tiling": Case(replace("multiple_of: threads * vec_elems", "multiple_of: 2 ** 3"),
                         "codegen.tiling.0.multiple_of", "`**`", "multiple_of: 2 **"),
    "// 0": Case(replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}", "bytes: rows // 0"),
                 "perf.bytes", "division by zero", "bytes: rows // 0"),
    "% 0 in the grid": Case(replace("grid: [rows // rpt]", 'grid: ["rows % 0"]'), "codegen.grid.0",
                            "division by zero", "grid: ["),
    "/ 0.0 in a shape": Case(replace("shape: [hidden],", 'shape: ["hidden / 0.0"],'),
                             "codegen.inputs.1.shape.0", "division by zero", "name: weight"),
    "100,000-term expression": Case(replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}",
                                            'bytes: "' + "+".join(["1"] * 100_000) + '"'),
                                    "perf.bytes", "characters long (at most 200)", "bytes: \"1+1"),
    "float overflow": Case(replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}", 'bytes: "1e308 * 10"'),
                           "perf.bytes", "not a finite number", "bytes: \"1e308"),
    "a call": Case(replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}", 'bytes: "__import__(\'os\')"'),
                   "perf.bytes", "unsupported function", "bytes: \"__import__"),
    "include folder that is no folder": Case(replace("  threads: 128", "  include_dirs: [kernels/no_such_folder]\n  threads: 128"),
                                              "codegen.include_dirs.0", "is not a folder", "include_dirs:"),
    # ranges: what becomes a C++ int, float or size
    "rows: 4294967296": Case(replace("{rows: 1, hidden: 4096, rpt: 1}", "{rows: 4294967296, hidden: 4096, rpt: 1}"),
                             "codegen.variants.decode_r1_h4096.rows",
                             "above the maximum 2147483647 (it becomes a C++ int)", "rows: 4294967296"),
    "hidden: 2147484672": Case(replace("{rows: 1, hidden: 4096, rpt: 1}", "{rows: 1, hidden: 2147484672, rpt: 1}"),
                               "codegen.variants.decode_r1_h4096.hidden", "it becomes a C++ int",
                               "hidden: 2147484672"),
    "negative size": Case(replace("{rows: 1, hidden: 4096, rpt: 1}", "{rows: -1, hidden: 4096, rpt: 1}"),
                          "codegen.variants.decode_r1_h4096.rows", "below the minimum 0", "rows: -1"),
    "grid past int32": Case(replace("grid: [rows // rpt]", 'grid: ["rows * 2147483648"]'), "codegen.grid.0",
                            "does not fit the C++ int GRID", "grid: ["),
    "extent past int32": Case(replace("{name: input,  dtype: bf16, shape: [rows, hidden]",
                                      '{name: input,  dtype: bf16, shape: [rows, "hidden * 524288"]'),
                              "codegen.inputs.0.shape.1", "more than 2147483647", "name: input"),
    "tensor past 2**63 bytes": Case(replace("shape: [hidden],       partition: [-1]",
                                            "shape: [2147483647, 2147483647, 2147483647], partition: [-1, -1, -1]"),
                                    "codegen.inputs.1.shape", "more than a 64-bit", "name: weight"),
    "tiling overflows C++ int": Case(replace("multiple_of: threads * vec_elems",
                                             "multiple_of: threads * vec_elems * 4194304"),
                                     "codegen.tiling.0.multiple_of", "not a C++ int", "multiple_of:"),
    "int param past int32": Case(replace("vec_elems: 8 ", "vec_elems: 4294967296 "), "codegen.params.vec_elems",
                                 "does not fit the C++ int", "vec_elems: 4294967296"),
    "float param past float32": Case(replace("eps: 1.0e-6", "eps: 1.0e+39"), "codegen.params.eps",
                                     "does not fit the C++ float", "eps: 1.0e+39"),
    "float param inf": Case(replace("eps: 1.0e-6", "eps: .inf"), "codegen.params.eps", "not a finite number",
                            "eps: .inf"),
    "smem region past the budget": Case(replace("bytes: 64, align: 16", "bytes: 4294967296, align: 16"),
                                        "codegen.smem.regions.0", "SMEM over budget", "name: warp_sums"),
    "alignment past the harness's 1024": Case(replace("bytes: 64, align: 16", "bytes: 64, align: 4096"),
                                              "codegen.smem.regions.0.align", "above the maximum 1024",
                                              "name: warp_sums"),
    "perf bytes past 2**63": Case(replace("bytes: {read: (rows * hidden + hidden) * 2, write: rows * hidden * 2}",
                                          'bytes: "rows * hidden * hidden * hidden * hidden * 1000000"'),
                                  "perf.bytes", "more than 2**63", "bytes: \"rows"),
    "generator beyond bf16": Case(replace("low: 0.5, high: 1.5}", "low: 0.5, high: 1.0e+39}"),
                                  "generators.weight.high", "beyond bf16's largest", "weight: {dist"),
    "300 variants": Case(many_variants(300), "codegen.variants",
                         f"has 300 entries, at most {config.MAX_VARIANTS} (the variant cap", "  variants:"),
    "100,000 variants": Case(many_variants(100_000), "<top>", f"more than the {config.MAX_SPEC_BYTES}", 1),
    # gate settings
    "timeout_s: .inf": Case(replace("  timeout_s: 300", "  timeout_s: .inf"), "validate.timeout_s",
                            "not a finite number", "timeout_s: .inf"),
    "timeout_s: a year": Case(replace("  timeout_s: 600", "  timeout_s: 31536000"), "perf.timeout_s",
                              f"above the maximum {config.MAX_TIMEOUT_S}", "timeout_s: 31536000"),
    "timeout_s: 0": Case(replace("  timeout_s: 300", "  timeout_s: 0"), "validate.timeout_s", "not above 0",
                         "timeout_s: 0"),
    "cos_min: .nan": Case(replace("cos_min: 0.999", "cos_min: .nan"), "validate.cos_min",
                          "not a finite number", "cos_min: .nan"),
    "cos_min: 1.5": Case(replace("cos_min: 0.999", "cos_min: 1.5"), "validate.cos_min", "above the maximum 1",
                         "cos_min: 1.5"),
    "rel_max: 5": Case(replace("rel_max: 3.0e-2", "rel_max: 5"), "validate.rel_max", "above the maximum 1",
                       "rel_max: 5"),
    "repeats: a billion": Case(replace("repeats: 7", "repeats: 1000000000"), "perf.repeats",
                               "above the maximum 1000", "repeats: 1000000000"),
    # loaded, then failed later before issue 43: every one is refused at load now
    "align: 16.0": Case(replace("bytes: 64, align: 16}", "bytes: 64, align: 16.0}"),
                        "codegen.smem.regions.0.align", "expected integer, got float", "align: 16.0"),
    "trials: 3.0": Case(replace("  trials: 3\n", "  trials: 3.0\n"), "validate.trials",
                        "expected integer, got float", "trials: 3.0"),
    "float template argument": Case(replace("{rows: 1, hidden: 4096, rpt: 1}", "{rows: 1, hidden: 4096.0, rpt: 1}"),
                                    "codegen.variants.decode_r1_h4096.hidden", "expected integer, got float",
                                    "hidden: 4096.0"),
    "threads: 512": Case(replace("  threads: 128", "  threads: 512"), "codegen.threads",
                         "more than MPK's worker block of 256", "threads: 512"),
    "variant named int": Case(replace("decode_r1_h4096:    {rows: 1", "int:    {rows: 1"),
                              "codegen.variants.int", "a C++ keyword", "int:    {rows"),
    "variant named class": Case(replace("decode_r1_h4096:    {rows: 1", "class:    {rows: 1"),
                                "codegen.variants.class", "a C++ keyword", "class:    {rows"),
    "variant named __global__": Case(replace("decode_r1_h4096:    {rows: 1", "__global__:    {rows: 1"),
                                     "codegen.variants.__global__", "reserved in C++", "__global__:"),
    "variant named THREADS": Case(replace("decode_r1_h4096:    {rows: 1", "THREADS:    {rows: 1"),
                                  "codegen.variants.THREADS", "a name the spec header defines", "THREADS:"),
    "variant named namespace": Case(replace("decode_r1_h4096:    {rows: 1", "namespace:    {rows: 1"),
                                    "codegen.variants.namespace", "a C++ keyword", "namespace:"),
    "tensor named threadIdx": Case(replace("{name: output, dtype: bf16, shape: [rows, hidden], partition: [0, -1]}",
                                           "{name: threadIdx, dtype: bf16, shape: [rows, hidden], partition: [0, -1]}"),
                                   "codegen.outputs.0.name", "a CUDA built-in variable", "name: threadIdx"),
    "variant named blockDim": Case(replace("decode_r1_h4096:    {rows: 1", "blockDim:    {rows: 1"),
                                   "codegen.variants.blockDim", "a CUDA built-in variable", "blockDim:"),
    "variant symbol grid": Case(replace("{rows: 1, hidden: 4096, rpt: 1}", "{rows: 1, hidden: 4096, rpt: 1, grid: 2}"),
                                "codegen.variants.decode_r1_h4096.grid", "decode_r1_h4096::GRID", "grid: 2"),
    "param worker_threads": Case(replace("    eps: 1.0e-6\n", "    eps: 1.0e-6\n    worker_threads: 256\n"),
                                 "codegen.params.worker_threads", "WORKER_THREADS", "worker_threads: 256"),
    "more tasks than the split dim": Case(replace("grid: [rows // rpt]", 'grid: ["rows * 2"]'), "codegen.grid.0",
                                          "has only 1 elements to give them", "grid: ["),
    "split dim the grid does not count": Case(
        chain(*_SMALL_LARGE, replace("{name: output, dtype: bf16, shape: [rows, hidden], partition: [0, -1]}",
                                     "{name: output, dtype: bf16, shape: [rows, hidden], partition: [-1, 0]}")),
        "codegen.outputs.0.partition", "divides it for the listed variants only: for variant "
        "decode_r1_h4096 with rows=3 (a binding the tiling rules allow) it is 4096 over 3 tasks", "name: output"),
    "output whole in every task": Case(
        replace("{name: output, dtype: bf16, shape: [rows, hidden], partition: [0, -1]}",
                "{name: output, dtype: bf16, shape: [hidden], partition: [-1]}"),
        "codegen.outputs.0.partition", "each of the 8 tasks of variant decode_r8_h4096", "name: output"),
    "output whole beyond the listed variants": Case(
        chain(replace("{name: output, dtype: bf16, shape: [rows, hidden], partition: [0, -1]}",
                      "{name: output, dtype: bf16, shape: [hidden], partition: [-1]}"),
              *[replace(f"{{rows: {r}, hidden", "{rows: 1, hidden") for r in (8, 16, 8, 16, 4096, 16384)],
              replace("rpt: 4}", "rpt: 1}"), replace("rpt: 8}", "rpt: 1}")),
        "codegen.outputs.0.partition", "decode_r1_h4096 with rows=2", "name: output"),
    "params eps and EPS": Case(replace("    eps: 1.0e-6\n", "    eps: 1.0e-6\n    EPS: 1.0e-5\n"),
                               "codegen.params.EPS", "param 'eps'", "EPS: 1.0e-5"),
    # the runtime section: the incumbent it names, its params, the shapes it takes
    "unknown incumbent": Case(replace("task: rmsnorm_hopper,", "task: rms_norm_hopper,"),
                              "runtime.incumbent.0.task", "no incumbent named 'rms_norm_hopper'",
                              "task: rms_norm_hopper"),
    "incumbent of another op": Case(replace("task: rmsnorm_hopper,", "task: silu_mul,"),
                                    "runtime.incumbent.0.task", "stands in for op 'silu_mul'", "task: silu_mul"),
    "incumbent param it lacks": Case(replace("params: {rows_per_task: 1}", "params: {rows: 1}"),
                                     "runtime.incumbent.0.params.rows", "takes no param 'rows'",
                                     "params: {rows: 1}"),
    "incumbent shape refused": Case(replace("params: {rows_per_task: 1}", "params: {rows_per_task: 3}"),
                                    "runtime.incumbent.0", "rows_per_task 3 does not divide",
                                    "rows_per_task: 3"),
    "in-runtime threshold without incumbent": Case(
        replace("task: rmsnorm_hopper, params: {rows_per_task: 1}}",
                'task: rmsnorm_hopper, params: {rows_per_task: 1}}\n    - {variants: "large_*", task: none}'),
        "runtime.thresholds.0.variants", "has no incumbent to judge", "max_vs_incumbent"),
}


def expected_line(root: Path, case: Case) -> int:
    if isinstance(case.line, int):
        return case.line
    text = (root / SPEC).read_bytes().decode("utf-8", "replace")
    for i, line in enumerate(text.split("\n"), 1):
        if case.line in line:
            return i
    raise AssertionError(f"needle {case.line!r} not in the edited spec")


def check_message(err: SpecError, root: Path, case: Case) -> None:
    text = str(err)
    assert err.file == SPEC, text
    got = ".".join(map(str, err.path)) or "<top>"
    assert got == case.path or (case.prefix and got.startswith(case.path + ".")), text
    assert err.line == expected_line(root, case), text
    assert case.fragment in err.message, text
    assert "\n" not in text and len(text) < 400, text[:500]


@pytest.mark.parametrize("name", list(CASES))
def test_loader_refuses_with_one_located_message(root, name):
    case = CASES[name]
    case.mutate(root)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(SpecError) as info:
            load_spec(root / SPEC, root)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    check_message(info.value, root, case)
    assert elapsed < CEILING_S, f"{name}: {elapsed:.1f} s"
    assert peak < CEILING_BYTES, f"{name}: {peak / 1e6:.0f} MB"
    assert not (root / "build").exists()


# one scons start costs about a second: the cases the issue reproduced, plus a few kinds
SCONS_CASES = ["alias bomb (9 levels)", "9 ** 9 ** 9", "rows: 4294967296", "hidden: 2147484672",
               "100,000 variants", "timeout_s: .inf", "cos_min: .nan", "non-UTF-8 spec",
               "non-UTF-8 reference.py", "unknown tag", "// 0", "100,000-term expression", "empty file",
               "trials: 3.0", "variant named __global__"]


def scons_measured(root: Path, *args: str) -> tuple[int, str, str, float, int]:
    """Run scons in root; (exit status, stdout, stderr, seconds, the child's peak RSS bytes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU")}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES), str(root / "site_scons")])
    out, err = root / ".scons-stdout", root / ".scons-stderr"
    start = time.perf_counter()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "SCons", "-Q", *args,
                                 "executor=fake_gpu:FakeGpuExecutor"],
                                cwd=root, env=env, stdout=fo, stderr=fe)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - start
    return proc.returncode, out.read_text(), err.read_text(), elapsed, usage.ru_maxrss * 1024


@pytest.mark.parametrize("name", SCONS_CASES)
def test_scons_refuses_before_writing_anything(tmp_path, name):
    proj = copy_project(tmp_path / "proj")
    case = CASES[name]
    case.mutate(proj.root)
    line = expected_line(proj.root, case)
    for args in (("stage=compile",), ("-n", "stage=compile"), ("status",)):
        code, stdout, stderr, elapsed, rss = scons_measured(proj.root, *args)
        assert code == 2, (args, code, stdout, stderr)
        errors = [l for l in stderr.splitlines() if l.strip()]
        assert errors == [errors[0]] and errors[0].startswith(f"mpk: error: {SPEC}:{line}: {case.path}: "), \
            (args, stderr)
        assert case.fragment in errors[0]
        assert not (proj.root / "build").exists(), args
        assert not (proj.root / ".sconsign.dblite").exists(), args
        assert elapsed < CEILING_S, f"{name} {args}: {elapsed:.1f} s"
        assert rss < CEILING_BYTES, f"{name} {args}: {rss / 1e6:.0f} MB"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_spec_that_is_no_regular_file_is_refused_without_reading_it(tmp_path, kind):
    """A FIFO would block the first read forever (build and status hung): refused by its
    file type, before it is opened."""
    proj = copy_project(tmp_path / "proj")
    path = proj.root / SPEC
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    for args in (("stage=compile",), ("status",)):
        code, _, stderr, elapsed, _ = scons_measured(proj.root, *args)
        assert code == 2 and "a spec must be a regular file" in stderr, (args, stderr)
        assert elapsed < CEILING_S
    assert not (proj.root / "build").exists()


def test_a_huge_spec_is_refused_by_its_size_before_it_is_read(tmp_path):
    """The size is checked before anything reads the file (the cache hash read it whole)."""
    from mpkbuild.stages import load_kernel
    proj = copy_project(tmp_path / "proj")
    path = proj.root / SPEC
    with open(path, "ab") as fh:
        fh.truncate(200 * 1024 * 1024)               # sparse: 200 MB that costs no disk
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as info:
            load_kernel(proj.root, K, write_cache=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"more than the {config.MAX_SPEC_BYTES}" in info.value.message
    assert peak < 10 * 1024 * 1024, f"{peak / 1e6:.0f} MB"


def test_body_symlinked_out_of_the_repository_is_refused_with_a_fresh_cache(tmp_path):
    from mpkbuild.stages import load_kernel
    proj = copy_project(tmp_path / "proj")
    proj.scons("stage=spec")                         # a full load: the spec cache is written
    assert load_kernel(proj.root, K, write_cache=False).spec.from_cache
    body = proj.root / "kernels" / K / f"{K}.cuh.j2"
    outside = tmp_path / "outside.cuh.j2"
    outside.write_bytes(body.read_bytes())
    body.unlink()
    body.symlink_to(outside)
    with pytest.raises(SpecError) as info:
        load_kernel(proj.root, K, write_cache=False)
    assert info.value.path == ("codegen", "body") and "escapes the repository" in info.value.message
    before = {p: p.stat().st_mtime_ns for p in (proj.root / "build").rglob("*") if p.is_file()}
    run = proj.scons("stage=spec", check=False)
    assert run.returncode == 2 and f"{SPEC}:" in run.stderr and "codegen.body" in run.stderr \
        and "escapes the repository" in run.stderr, run.stderr
    after = {p: p.stat().st_mtime_ns for p in (proj.root / "build").rglob("*") if p.is_file()}
    assert after == before                           # nothing written, nothing removed


def test_cached_load_knows_the_reference_by_its_bytes_never_its_mtime(tmp_path, monkeypatch):
    """A fresh spec cache keeps the reference's function names by the sha256 of its bytes:
    the same bytes are not parsed again; a same-size edit with its mtime put back is
    parsed and refused, as a full load refuses it."""
    from mpkbuild.model import section as spec_mod
    from mpkbuild.stages import load_kernel
    proj = copy_project(tmp_path / "proj")
    proj.scons("stage=spec")                         # a full load: the spec cache is written

    def parsed(raw, rel):
        raise AssertionError(f"{rel} parsed again")
    with monkeypatch.context() as m:
        m.setattr(spec_mod, "top_level_functions", parsed)
        assert load_kernel(proj.root, K, write_cache=False).spec.from_cache
    ref = proj.root / REF
    st = ref.stat()
    raw = ref.read_bytes()
    ref.write_bytes(raw.replace(b"def rmsnorm_reference(", b"def rmsnorm_referencf(", 1))
    os.utime(ref, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ref.stat().st_size == st.st_size
    with pytest.raises(SpecError) as info:
        load_kernel(proj.root, K, write_cache=False)
    assert info.value.path == ("validate", "reference") and "rmsnorm_reference" in info.value.message


@pytest.mark.parametrize("suffix", [".cuh.j2", ".cuh"])
def test_non_utf8_body_is_one_located_error_at_generate(root, suffix):
    from mpkbuild.stages import generate as codegen
    spec = load_spec(root / SPEC, root)
    body = root / "kernels" / K / f"{K}{suffix}"
    text = (root / "kernels" / K / f"{K}.cuh.j2").read_bytes()
    body.write_bytes(text.replace(b"// One task = RPT", b"// One task \xff RPT", 1))
    line = body.read_bytes().split(b"\n").index(next(l for l in body.read_bytes().split(b"\n") if b"\xff" in l)) + 1
    with pytest.raises(codegen.TemplateError) as info:
        codegen.render_file("body", spec.sections["codegen"], spec.file, body, root)
    assert str(info.value) == f"kernels/{K}/{K}{suffix}:{line}: not UTF-8 text (byte 0xff)"


def test_a_kernel_named_as_cxx_reserves_is_refused_at_load(tmp_path):
    """A kernel's name is its C++ namespace, task function and entry points: `__global__`
    (reserved: a double underscore) is refused at load, naming the file, line and field."""
    root = copy_project(tmp_path / "proj").root
    text = (root / SPEC).read_text().replace(f"kernel: {K}\n", "kernel: __global__\n", 1)
    assert "kernel: __global__" in text
    (root / "specs" / "__global__.yaml").write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(root / "specs" / "__global__.yaml", root)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("kernel:"))
    assert str(err.value).startswith(f"specs/__global__.yaml:{line}: kernel: kernel name '__global__'"), err.value
    assert "reserved in C++" in str(err.value)


def test_a_block_naming_a_kernel_without_a_spec_is_refused_at_its_line(tmp_path):
    """runtime.blocks names other kernels of the project; one whose spec is not there is an
    error at the block layer's line, before anything runs or is written."""
    p = copy_project(tmp_path / "proj", kernels=("linear_v2",))
    run = p.scons("-n", "kernel=linear_v2", "stage=compile", check=False)
    assert run.returncode == 2
    lines = p.path("specs/linear_v2.yaml").read_text().splitlines()
    line = next(i for i, l in enumerate(lines, 1) if "{kernel: rmsnorm_v2," in l)
    assert (f"specs/linear_v2.yaml:{line}: runtime.blocks[0].layers[0].kernel: no kernel 'rmsnorm_v2' "
            "(specs/rmsnorm_v2.yaml does not exist)") in run.stderr, run.stderr
    assert not (p.root / "build").exists()
