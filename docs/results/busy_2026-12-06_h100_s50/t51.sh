# Run in session 51 (one H100 lease; results in docs/results/busy_2026-12-06_h100_s51/). Issue 66 targets 1 (32 dense) and 3 (32
# sparse) on one H100: one process against --workers-per-gpu 2, without and with CUDA MPS, interleaved in one
# lease. Session 50 measured one process only (32 sparse p99 41-51 ms; 32 dense 754 frames/s); session 43/45's
# workers figures were on an H200. Send .dev/kit, the ort-gpu parts, .dev/nvdec, .dev/models, .dev/ff, .dev/av and
# .dev/vid (words500.mp4) along, as in session 50 (README of the device kits).
set -u
R=$OUT/t51; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
[ -f /tmp/words500.mp4 ] || cp .dev/vid/words500.mp4 /tmp/
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
  -g 30 -pix_fmt yuv420p $V
sparse() {  # $1 label, rest: flags; 32 live sparse streams, 20 s
  local label=$1; shift
  python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 32); do echo --source $V; done) --loop --realtime \
    --duration 20 --metrics "" --summary $R/$label.json "$@" >/dev/null 2>$R/$label.err
  python - $R/$label.json $label <<'PY' | tee -a $R/sparse.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
print(sys.argv[2], s["throughput_fps"], "dropped", sum(s["dropped"]), "p50", t["0.5"], "p99", t["0.99"], "cores", s["cpu_cores"])
PY
}
dense() {  # $1 tag; 32 dense live streams, one process against two workers, one pair
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
    --variant 'workers2=--workers-per-gpu 2' --json $R/dense32_$1.json 2>&1 | tail -2 | cut -c1-400
}
if [ "${PART:-1}" = 1 ]; then  # no MPS
  sparse s32one; sparse s32w2 --workers-per-gpu 2; sparse s32one_b; sparse s32w2_b --workers-per-gpu 2
  dense nomps
fi
if [ "${PART:-1}" = 2 ]; then  # MPS
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/gpu.txt
  sparse s32one_mps; sparse s32w2_mps --workers-per-gpu 2; sparse s32one_mps_b; sparse s32w2_mps_b --workers-per-gpu 2
  dense mps
  echo quit | nvidia-cuda-mps-control 2>/dev/null; echo "MPS off"
fi
