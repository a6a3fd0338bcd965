# Session 64: a session for every batch size up to 8 (backends.batch_buckets) against the tree before it (.dev/old,
# `git archive 5f38533`, docs and tests left out), one lease, arms interleaved.
# PART=B: scripts/diag/bucket_cost.py on the bundle (what the rows past a partial batch cost; each session's MiB).
#   The first lease ran it with the script as then (its "bucket" column compared against the new buckets: read its
#   "own ms" and "session MiB"); PART=B2: the script now (against the powers of two), ORT's default arena against
#   kSameAsRequested, and that with cuDNN's convolution workspace kept to what it needs.
# PART=C: target 3: 32 network cameras on clocks of their own (testsrc2 1080p30), CLI defaults + jsonl (auto: two
#   instances), new tree against old, ${REPEATS:-2} pairs.
# PART=U: start-up: a 2 s serve of 4 synthetic streams, wall time to exit, new against old, 3 pairs (each instance
#   makes and warms one session a bucket: 8 against 4).
# PART=T: the GPU tests the change touches (every ONNX Runtime CUDA run): runtime and pipelines.
# PART=O: 96 overloaded live streams of the 72-word video, 66 ms budget, new against old (batches are full: no change
#   expected) and 16 live sparse files, new against old.
set -u
has() { [[ " ${PART:-B} " == *" $1 "* ]]; }
R=$OUT/t73; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
grep -m1 "model name" /proc/cpuinfo | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
V=$PWD/.dev/vid/nob.mp4
if has B; then
  python scripts/diag/bucket_cost.py /tmp/det --json $R/bucket_cost.json 2>&1 | tee $R/bucket_cost.txt
fi
if has B2; then
  for o in "" "--cuda-option arena_extend_strategy=kSameAsRequested" \
      "--cuda-option arena_extend_strategy=kSameAsRequested --cuda-option cudnn_conv_use_max_workspace=0"; do
    echo "== bucket_cost $o" | tee -a $R/bucket_cost2.txt
    python scripts/diag/bucket_cost.py /tmp/det $o 2>&1 | grep -v onnxruntime_pybind | tee -a $R/bucket_cost2.txt
  done
fi
if has T; then
  timeout 530 python -m pytest -m gpu -q -p no:cacheprovider tests/runtime/test_gpu.py tests/pipelines -k "not triton" \
    2>&1 | tee $R/tests_full.txt | tail -15
fi
if has C; then
  python scripts/bench_busy.py /tmp/det --video $V --no-rules --streams 32 --seconds 20 --repeats ${REPEATS:-2} \
    --network --remux-shim --camera-phases random --tree new=. --tree old=.dev/old --serve-timeout 120 \
    --json $R/cameras32.json > $R/cameras32.txt 2>&1
  python - $R/cameras32.json <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print("cameras32", r["run"], r["fps"], "dropped", r["dropped"], "catching up", r.get("dropped_catching_up"),
          "p50", r["p50_ms"], "p99", r["p99_ms"], "steady", r["steady_p50_ms"], r["steady_p99_ms"], "tail",
          r["steady_tail_ms"], "settled p99", r.get("settled_p99_ms"), r.get("settled_tail_ms"), "by 2 s",
          r.get("p99_by_window"), "a batch", r["frames_a_batch"], "gpu", r["gpu_busy_share"])
PY
fi
serve() { # $1 tree, $2 label, $3.. serve flags
  local tree=$1 label=$2; shift 2
  local t0=$(date +%s.%N)
  (cd $tree && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 200 python -m jetpipe serve --bundle /tmp/det "$@" --metrics "" \
    --summary $R/$label.json >/dev/null 2>$R/$label.err) || echo "$label: exit $?" | tee -a $R/runs.txt
  local t1=$(date +%s.%N)
  python - $R/$label.json $label $t0 $t1 <<'PY' | tee -a $R/runs.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
print(sys.argv[2], "wall", round(float(sys.argv[4]) - float(sys.argv[3]), 2), "fps", s["throughput_fps"], "dropped", sum(s["dropped"]), "p50", t["0.5"],
      "p99", t["0.99"], "per stream", min(s["processed"]), max(s["processed"]), "gpu", s.get("gpu_busy_share"))
PY
}
S() { for i in $(seq $1); do echo --source $2; done; echo --loop --realtime; }
if has U; then
  for i in 1 2 3; do for t in new old; do
    serve $([ $t = new ] && echo . || echo .dev/old) start_${t}_$i \
      $(for s in 1 2 3 4; do echo --source synthetic://1920x1080@30; done) --duration 2
  done; done
fi
if has O; then
  cp -n .dev/vid/words72.mp4 /tmp/
  for t in new old; do
    serve $([ $t = new ] && echo . || echo .dev/old) over96_$t $(S 96 /tmp/words72.mp4) --latency-budget-ms 66 --duration 20
  done
  for t in new old; do
    serve $([ $t = new ] && echo . || echo .dev/old) sparse16_$t $(S 16 $V) --duration 20
  done
fi
P=${PART:-B}; (cd $OUT && tar czf t73_${P// /_}.tgz t73 && rm -rf t73)
