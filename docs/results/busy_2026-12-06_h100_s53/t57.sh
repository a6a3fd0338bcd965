# Session 53, one H100 lease: workers_per_gpu auto (the new default) against one process (--workers-per-gpu 1, the
# default before), the same tree, interleaved.
# PART=T: the GPU tests the capture fix (5190d42: an opening lasts until the first frame) and the default touch.
# PART=W1: CUDA MPS running: 32 live sparse streams (testsrc2), auto / one, two pairs; 32 dense streams (500
#   words), auto / one, one pair (bench_busy.py).
# PART=W2: CUDA MPS running: 48 and 96 overloaded live streams of the 72-word video, 66 ms budget, auto / one.
set -u
R=$OUT/t57; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
  -g 30 -pix_fmt yuv420p $V
for w in 72 500; do [ -f /tmp/words$w.mp4 ] || cp .dev/vid/words$w.mp4 /tmp/; done
run() { # $1 label, $2.. serve flags
  local label=$1; shift 1
  python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" --summary $R/$label.json \
    >/dev/null 2>$R/$label.err
  python - $R/$label.json $label $R/$label.err <<'PY' | tee -a $R/runs.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
said = [l.split("workers_per_gpu auto: ", 1)[1][:90] for l in open(sys.argv[3]) if "workers_per_gpu auto: " in l]
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(s["dropped"]), "p50", t["0.5"],
      "p99", t["0.99"], "processes", len(s.get("gpus", [])) or 1, "said", said)
PY
}
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/runs.txt
}
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; echo "MPS off" | tee -a $R/runs.txt; }
S() { for i in $(seq $1); do echo --source $2; done; echo --loop --realtime; }
if [ "${PART:-T}" = T ]; then
  for f in "tests/pipelines/ingest/test_video_gpu.py -k network" tests/pipelines/service/test_gpus_gpu.py; do
    timeout 300 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -4 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-T}" = W1 ]; then
  mps_on
  for k in 1 2; do run sparse32_auto_$k $(S 32 $V); run sparse32_one_$k $(S 32 $V) --workers-per-gpu 1; done
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
    --variant 'one=--workers-per-gpu 1' --json $R/dense32.json > $R/dense32.txt 2>&1
  python - $R/dense32.json <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print("dense32", r["run"], r["fps"], "dropped", r["dropped"], "p99", r["p99_ms"], "tracked", r["tracked_per_frame"],
          "us/object", r["serving_us_per_object"], "processes", r["serving_processes"], "gpu", r["gpu_busy_share"],
          "said", (r["workers_said"] or "")[:90])
PY
  mps_off
fi
if [ "${PART:-T}" = W2 ]; then
  mps_on
  for n in 48 96; do
    run over${n}_auto $(S $n /tmp/words72.mp4) --latency-budget-ms 66
    run over${n}_one $(S $n /tmp/words72.mp4) --latency-budget-ms 66 --workers-per-gpu 1
  done
  mps_off
fi
