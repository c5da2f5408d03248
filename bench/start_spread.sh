#!/usr/bin/env bash
# Where the start spread goes (bench/start_spread.py): linear_v2 trimmed to KEEP (a regex of
# its variants, default m1 n4096_k4096) through the runtime gate in a copy of the project
# whose checkout's worker marks its queue fetches; the table last, the dumps in OUTDIR/dumps.
#
#   on box:  bash bench/start_spread.sh OUTDIR [KEEP]       (carry .whl and .mirage)
set -uo pipefail
out=${1:?usage: start_spread.sh OUTDIR [KEEP]}
keep=${2:-^decode_m1_n4096_k4096\$}
root=$PWD copy=/tmp/start-spread
[ -d .mirage/mpk/include ] || { echo "no .mirage/mpk/include: carry the MPK headers (docs/gpu-box.md)"; exit 2; }
mkdir -p "$out/dumps" && out=$(cd "$out" && pwd)      # the run below works in the copy
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
rm -rf "$copy" && mkdir -p "$copy" && cp -r specs kernels site_scons SConstruct pyproject.toml bench .mirage "$copy/"
python3 bench/start_spread.py patch "$copy/.mirage" "$copy/site_scons" || exit 1
cd "$copy" && python3 bench/trim_spec.py specs/linear_v2.yaml "$keep" || exit 1
SPREAD_DUMP="$out/dumps" PYTHONPATH=/tmp/site:$copy/site_scons timeout "${SIDE_TIMEOUT_S:-240}" \
  python3 -m SCons -Q -k -j16 kernel=linear_v2 stage=runtime mpk_root=.mirage/mpk warm=0 > "$out/runtime.log" 2>&1
echo "runtime exit $?"; sed -n '/^verdicts:/,$p' "$out/runtime.log" | cut -c1-200
cp build/linear_v2/gpu/*/runtime.json "$out/" 2>/dev/null
cp build/linear_v2/gpu/*/runtime.log "$out/runner.log" 2>/dev/null
python3 "$root/bench/start_spread.py" parse "$out/dumps" | tee "$out/table.md"
