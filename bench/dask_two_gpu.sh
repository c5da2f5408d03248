#!/usr/bin/env bash
# executor=dask on one multi-GPU box: a scheduler and one worker per visible GPU
# (CUDA_VISIBLE_DEVICES=i, --nthreads 1, --resources GPU=1) on 127.0.0.1, then
# `scons stage=validate executor=dask -j2` over every catalog kernel in a fresh copy of the
# tree, a table (kernel, gate, verdict, worker, seconds), and the cluster stopped again.
# Usage, from the project root on the box: bash bench/dask_two_gpu.sh OUTDIR
# (STAGE=perf for validate+perf, JOBS=N for -jN, KERNELS=a,b for fewer than all). The box has no network: the wheels travel in
# .whl/ (../shared/tools/gpu-box-wheels.sh, see the README); the workers get only /tmp/site
# on PYTHONPATH, never our tree: the gates bring mpkbuild with them.
set -uo pipefail
out=${1:-/tmp/mpk-dask-out}
stage=${STAGE:-validate}
jobs=${JOBS:-2}
repo=$PWD
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/mpk-dask.XXXXXX)
if [ "${INSTALL_WHEELS:-1}" = 1 ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1

pids=()
stop_cluster() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null
    done
}
trap stop_cluster EXIT

# the GPUs this run may use: CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi lists
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
else
    mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
fi
[ "${#gpus[@]}" -gt 0 ] || { echo "no GPU visible (nvidia-smi)"; exit 1; }
nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader | tee "$out/gpu.txt"

sched="$work/scheduler.json"
python3 -m distributed.cli.dask_scheduler --host 127.0.0.1 --port 0 --no-dashboard \
    --scheduler-file "$sched" > "$out/scheduler.log" 2>&1 &
pids+=($!)
for i in "${gpus[@]}"; do
    CUDA_VISIBLE_DEVICES=$i python3 -m distributed.cli.dask_worker --scheduler-file "$sched" \
        --host 127.0.0.1 --nthreads 1 --resources GPU=1 --name "gpu$i" --no-dashboard \
        --local-directory "$work/worker-gpu$i" > "$out/worker-gpu$i.log" 2>&1 &
    pids+=($!)
done
python3 - "$sched" "${#gpus[@]}" <<'EOF' || { echo "the cluster did not come up: see $out/*.log"; exit 1; }
import json, os, sys, time
from distributed import Client
path, want = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while not os.path.exists(path):
    if time.monotonic() > deadline:
        sys.exit("no scheduler file after 120 s")
    time.sleep(0.2)
with Client(scheduler_file=path, timeout=30) as c:
    c.wait_for_workers(want, timeout=120)
    print("cluster:", json.load(open(path))["address"], "with", want, "GPU workers")
EOF

mkdir -p "$work/tree"
for f in SConstruct site_scons specs kernels wiring gpu_profiles pyproject.toml; do
    [ -e "$repo/$f" ] && cp -r "$repo/$f" "$work/tree/"
done
find "$work/tree" -name __pycache__ -prune -exec rm -rf {} +
cd "$work/tree"
start=$(date +%s.%N)
python3 -m SCons -k -j"$jobs" kernel="${KERNELS:-all}" stage="$stage" executor=dask scheduler_file="$sched" \
    > "$out/scons.log" 2>&1
rc=$?
end=$(date +%s.%N)
tail -25 "$out/scons.log"
python3 - "$rc" "$start" "$end" <<'EOF' | tee "$out/table.txt"
import glob, json, sys
rc, start, end = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
rows = []
for path in sorted(glob.glob("build/*/gpu/*/*.json")):
    r = json.load(open(path))
    if r.get("gate") not in ("validate", "perf"):
        continue
    rows.append((r["kernel"], r["gate"], r.get("verdict", "?"),
                 f"{r.get('worker', '-')} gpu{r.get('gpu_index', '?')}", r.get("elapsed_s", "?"),
                 r.get("queue_wait_s", "-"),
                 round(r["finished_at"] - r["started_at"], 2) if "started_at" in r else "-"))
# seconds: the runner's own; on worker: the task from unpacking to the answer; queued: waiting for a GPU
print(f"{'kernel':<14} {'gate':<9} {'verdict':<8} {'worker':<32} {'seconds':>8} {'on worker':>9} {'queued':>7}")
for k, g, v, w, s, q, t in rows:
    print(f"{k:<14} {g:<9} {v:<8} {w:<32} {s!s:>8} {t!s:>9} {q!s:>7}")
workers = {r[3] for r in rows}
print(f"\n{len(rows)} gates on {len(workers)} worker(s); scons -j: wall {end - start:.1f} s, exit {rc}")
EOF
tar czf "$out/logs.tgz" -C "$work/tree" build 2>/dev/null
exit $rc
