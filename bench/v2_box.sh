#!/usr/bin/env bash
# Runtime-V2 on the GPU box (issue 45): the v2 runtime gate of every catalog kernel through
# scons (runtime=v2 against the carried v2 tree), the head to head as a table
# (bench/runtime_table.py), its GPU tests, and the v2 fault fixture's validate case.
# Results (runtime.json per kernel in results.tgz, the logs) under OUTDIR.
#
#   bash bench/v2_box.sh OUTDIR
set -uo pipefail
out=${1:?usage: v2_box.sh OUTDIR}
[ -d .mirage/v2/include ] || { echo "no .mirage/v2/include: carry the v2 tree (docs/gpu-box.md)"; exit 1; }
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/site_scons PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
mkdir -p ../shared && ln -sfn "$PWD/.mirage" ../shared/mirage
timeout 300 python3 -m SCons -Q -k -j16 kernel=all stage=runtime mpk_root=.mirage/v2 runtime=v2 2>&1 \
    | tee "$out/runtime_v2.log" | sed -n '/^verdicts:/,$p'
timeout 60 python3 -m SCons -Q status kernel=all stage=runtime mpk_root=.mirage/v2 runtime=v2 2>&1 | tee "$out/status.txt" | tail -12
python3 bench/runtime_table.py > "$out/runtime_table.md"; tail -n +3 "$out/runtime_table.md" | cut -c1-150
tar czf "$out/results.tgz" build/*/gpu/*/runtime.json build/*/runtime/megakernel.cu 2>/dev/null
timeout 200 python3 -m pytest -v -rs -m gpu -p no:cacheprovider tests/stages/test_runtime_v2.py \
    "tests/stages/test_faults.py::test_fault_gets_its_verdict_on_the_gpu[kept_count]" 2>&1 \
    | tee "$out/tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8
