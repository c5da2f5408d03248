#!/usr/bin/env bash
# One call on the GPU box: install the carried wheels, run the tests (PYTEST_ARGS, e.g.
# "-m gpu"), the rmsnorm_v2 bench and the catalog table. Usage there: bash bench/gpu_box.sh OUTDIR
# (carry .whl/, made here by ../shared/tools/gpu-box-wheels.sh; see README "On the GPU box").
# OUTDIR gets the four text reports and logs.tgz (every log and result JSON).
set -uo pipefail
out=${1:-/tmp/mpk-out}
work=/tmp/mpk-gpu-box
mkdir -p "$out" "$work"
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/site_scons PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pytest -q -rs ${PYTEST_ARGS:-} 2>&1 | tee "$out/pytest.log" | tail -15
python3 bench/rmsnorm_gates.py --out "$work/bench" 2>&1 | tee "$out/bench.txt"
python3 bench/catalog.py --out "$work/catalog" 2>&1 | tee "$out/catalog.txt"
tar czf "$out/logs.tgz" -C "$work" .
