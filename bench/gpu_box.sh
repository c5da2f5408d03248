#!/usr/bin/env bash
# One call on the GPU box: install the carried wheels, then one part of the GPU work, so that
# each fits one 10-minute device call (the whole GPU suite did not: on one H200, 2026-12-01,
# 35 of its 37 tests took 575 s, with noise-driven sampling and the torch.compile baselines).
#
#   bash bench/gpu_box.sh OUTDIR PART      PART: gates | catalog | catalog-perf | runtime | targets | pipeline | linear | blocks | bench | review | tune
#
#   gates    pytest -m gpu: the fault verdicts, rmsnorm_v2's gates, the context flags
#   catalog  pytest -m gpu: every catalog kernel's validate, and the edge behaviours' teeth
#   catalog-perf  pytest -m gpu: every catalog kernel's perf thresholds (apart: with validate
#            they outlived one call on the H100, 2026-12-05)
#   runtime  pytest -m gpu: the runtime gate in the real MPK persistent kernel, v1 and v2;
#            needs the MPK headers carried as .mirage/ (mpk/ and v2/ include and src,
#            cutlass/include, json/include copied from ../shared/mirage; docs/gpu-box.md)
#   targets  pytest -m gpu: issue 58's targets (linear_v2, linear_residual_v2 and
#            rmsnorm_linear_silu_mul_v2 through every gate with the MPK checkout, as for
#            runtime), strict expected failures naming the numbers they miss by
#   pipeline pytest -m gpu: the warp-role pipeline (pipe_copy, pipe_tma, the family-A starter, the fault
#            that hangs) and the profile stage (ncu on linear_v2)
#   linear   the linears through scons, every gate (validate, perf, profile; with .mirage/
#            the runtime gate against MPK's TMA linear, cold): linear_v2 (issue 58's TMA
#            pipeline) and its fused forms (LINEAR_KERNELS=linear_v2: one; LINEAR_STAGES="runtime
#            perf": those stages in turn, each within PART_TIMEOUT_S; any catalog kernels can be
#            named), the reviews, results and logs in OUTDIR/linear.tgz
#   bench    bench/rmsnorm_gates.py (with .mirage/: the runtime gate too) and bench/catalog.py
#   review   every gate of every catalog kernel through scons (with .mirage/: wire and the
#            runtime gate too), the reviews in OUTDIR/review.tgz
#   blocks   linear_v2's MLP blocks inside MPK (with .mirage/), linear_v2 trimmed to one variant
#            and the ones its blocks run, in a copy of the project (bench/trim_spec.py
#            --keep-blocks): issue 58's block target in ~2 minutes where the whole runtime gate
#            takes ~4; OUTDIR/blocks.tgz
#   tune     bench/tune_bench.py for linear_v2, silu_mul_v2, rmsnorm_v2 (all three tune inside
#            MPK: with .mirage/ carried); the tuned files in OUTDIR/tuned/ (commit them to use
#            them)
#
# Each test's name and outcome is in OUTDIR/PART.log as it runs (-v), so a call cut short
# still says which tests passed; `timeout` ends a part that would outlive the call.
set -uo pipefail
out=${1:?usage: gpu_box.sh OUTDIR gates|catalog|catalog-perf|runtime|targets|pipeline|linear|blocks|bench|review|tune}
part=${2:?usage: gpu_box.sh OUTDIR gates|catalog|catalog-perf|runtime|targets|pipeline|linear|blocks|bench|review|tune}
limit=${PART_TIMEOUT_S:-560}
work=/tmp/mpk-gpu-box
mkdir -p "$out" "$work"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/site_scons PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
tests() { timeout "$limit" python3 -m pytest -v -rsP -m gpu -p no:cacheprovider --durations=15 "$@" 2>&1 | tee "$out/$part.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tail -40; }
case "$part" in
  gates)   tests tests/stages/test_faults.py tests/test_gpu.py tests/runners/test_gpuwait.py ;;
  catalog) tests tests/stages/test_gpu_catalog.py -k "not perf_thresholds" ;;
  catalog-perf) tests tests/stages/test_gpu_catalog.py -k perf_thresholds ;;
  pipeline) tests tests/stages/test_pipeline.py tests/stages/test_profile.py ;;
  runtime)
    [ -d .mirage/mpk/include ] || { echo "no .mirage/mpk/include: carry the MPK headers"; exit 1; }
    # the tests look for the pinned tree at ../shared/mirage, as on the CPU machines
    mkdir -p ../shared && ln -sfn "$PWD/.mirage" ../shared/mirage
    tests tests/stages/test_runtime_gate.py tests/stages/test_runtime_v2.py ;;
  targets)
    [ -d .mirage/mpk/include ] || { echo "no .mirage/mpk/include: carry the MPK headers"; exit 1; }
    mkdir -p ../shared && ln -sfn "$PWD/.mirage" ../shared/mirage
    tests tests/stages/test_gpu_linear_targets.py ;;
  bench)
    # with the MPK headers carried, the runtime gate's wall time and edit-to-verdict too
    mpk=(); [ -d .mirage/mpk/include ] && mpk=(--mpk-root .mirage/mpk)
    timeout "$limit" python3 bench/rmsnorm_gates.py --out "$work/bench" "${mpk[@]}" 2>&1 | tee "$out/bench.txt"
    timeout "$limit" python3 bench/catalog.py --out "$work/catalog" 2>&1 | tee "$out/catalog.txt"
    tar czf "$out/logs.tgz" -C "$work" . ;;
  review)
    mpk=(); [ -d .mirage/mpk/include ] && mpk=(mpk_root=.mirage/mpk)
    timeout "$limit" python3 -m SCons -Q -k -j16 kernel=all stage=review "${mpk[@]}" 2>&1 | tee "$out/review.log" | sed -n '/^verdicts:/,$p'
    tar czf "$out/review.tgz" build/review.md build/*/review.* build/*/junit.xml build/*/gpu/*/*.json 2>/dev/null ;;
  linear)
    mpk=(); [ -d .mirage/mpk/include ] && mpk=(mpk_root=.mirage/mpk)
    kernels=${LINEAR_KERNELS:-linear_v2,rmsnorm_linear_v2,rmsnorm_linear_silu_mul_v2,silu_mul_linear_residual_v2}
    for stage in ${LINEAR_STAGES:-review}; do
      timeout "$limit" python3 -m SCons -Q -k -j16 kernel="$kernels" stage="$stage" "${mpk[@]}" 2>&1 | tee -a "$out/linear.log" | sed -n '/^verdicts:/,$p'
    done
    for k in ${kernels//,/ }; do
      [ -f "build/$k/review.md" ] && sed -n '1,40p' "build/$k/review.md"
      ls build/$k/gpu/*/runtime.json >/dev/null 2>&1 && python3 bench/runtime_table.py build/$k/gpu/*/runtime.json
    done
    files=(); for k in ${kernels//,/ }; do files+=(build/$k/review.* build/$k/junit.xml build/$k/gpu/*/*.json build/$k/gpu/*/*.log); done
    tar czf "$out/linear.tgz" "${files[@]}" 2>/dev/null ;;
  blocks)
    [ -d .mirage/mpk/include ] || { echo "no .mirage/mpk/include: carry the MPK headers"; exit 1; }
    copy="$work/blocks"; rm -rf "$copy"; mkdir -p "$copy"
    cp -r specs kernels site_scons SConstruct pyproject.toml bench tuned "$copy/"; ln -sfn "$PWD/.mirage" "$copy/.mirage"
    (cd "$copy" && python3 bench/trim_spec.py specs/linear_v2.yaml '^decode_m8_n4096_k4096$' --keep-blocks &&
     timeout "$limit" python3 -m SCons -Q -k -j16 kernel=linear_v2 stage=runtime mpk_root=.mirage/mpk 2>&1 | tee "$out/blocks.log" | sed -n '/^verdicts:/,$p'
     python3 bench/runtime_table.py build/linear_v2/gpu/*/runtime.json | grep -E "^\| (kernel|---)|block:"
     tar czf "$out/blocks.tgz" build/linear_v2/gpu/*/runtime.json) ;;
  tune)
    mpk=(); [ -d .mirage/mpk/include ] && mpk=(mpk_root=.mirage/mpk)
    timeout "$limit" python3 bench/tune_bench.py -j16 "${mpk[@]}" 2>&1 | tee "$out/tune.txt"
    cp -r tuned "$out/" ;;
  *) echo "unknown part $part (gates, catalog, catalog-perf, runtime, targets, pipeline, linear, blocks, bench, review, tune)"; exit 2 ;;
esac
