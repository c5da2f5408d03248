#!/usr/bin/env bash
# A same-call A/B of the runtime gate: this tree against another revision, both judged against
# MPK's task on one GPU in one device call, so the two ratios share the machine, its clocks
# and its hour (ratios from two calls have differed by more than the change being measured:
# bench/RESULTS.md sections 32, 33).
#
#   here:    mkdir -p .ab && git archive REV | gzip > .ab/base.tgz       (.ab/ is ignored: carry it)
#   on box:  bash bench/runtime_ab.sh OUTDIR KERNEL [KEEP]
#
# KERNEL[,KERNEL...]: what `stage=runtime` builds on both sides. KEEP: a regex of the variants
# to keep on both sides (bench/trim_spec.py: the runtime blocks dropped), for a call too short
# for all of them. Neither side reads a tuned file of the kernels (the spec's configuration
# against the spec's configuration). This tree runs first; each side within SIDE_TIMEOUT_S
# (default 270). Output: OUTDIR/{new,base}.txt (bench/runtime_table.py), the scons logs and
# each side's runtime.json.
set -uo pipefail
out=${1:?usage: runtime_ab.sh OUTDIR KERNEL [KEEP]}
kernels=${2:?usage: runtime_ab.sh OUTDIR KERNEL [KEEP]}
keep=${3:-}
root=$PWD base=/tmp/ab-base
[ -f .ab/base.tgz ] || { echo "no .ab/base.tgz: make it here with git archive and carry .ab"; exit 2; }
[ -d .mirage/mpk/include ] || { echo "no .mirage/mpk/include: carry the MPK headers (docs/gpu-box.md)"; exit 2; }
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
rm -rf "$base" && mkdir -p "$base" && tar xzf .ab/base.tgz -C "$base" && ln -sfn "$root/.mirage" "$base/.mirage"
for dir in "$root" "$base"; do
  for k in ${kernels//,/ }; do
    rm -f "$dir"/tuned/*/"$k".json
    [ -n "$keep" ] && python3 "$root/bench/trim_spec.py" "$dir/specs/$k.yaml" "$keep"
  done
done
side() {  # DIR NAME
  (cd "$1" && PYTHONPATH="/tmp/site:$1/site_scons" timeout "${SIDE_TIMEOUT_S:-270}" python3 -m SCons -Q -k -j16 \
      kernel="$kernels" stage=runtime mpk_root=.mirage/mpk > "$out/$2.log" 2>&1
   echo "exit $?" >> "$out/$2.log"
   for k in ${kernels//,/ }; do
     if ls build/"$k"/gpu/*/runtime.json > /dev/null 2>&1; then
       PYTHONPATH="/tmp/site:$1/site_scons" python3 "$root/bench/runtime_table.py" build/"$k"/gpu/*/runtime.json
     else echo "$k: no runtime.json (see $2.log)"; fi
   done > "$out/$2.txt" 2>&1
   tar czf "$out/$2-json.tgz" build/*/gpu/*/runtime.json 2>/dev/null)
}
side "$root" new
side "$base" base
for s in new base; do echo "== $s ($(tail -1 "$out/$s.log"))"; cat "$out/$s.txt"; done
