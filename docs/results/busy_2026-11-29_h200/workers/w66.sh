# issue 66 session 43: --workers-per-gpu on one H200. PART=1: the GPU tests of the face, then 32 busy streams
# one process vs 2 workers (bench_busy, interleaved, 2 repeats). PART=2: 32 sparse one vs 2 workers, then MPS.
set -u
R=$OUT/w66; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast -g 30 -pix_fmt yuv420p $V
serve() { # $1 label $2 streams $3 video, rest: flags
  local label=$1 n=$2 video=$3; shift 3
  python -m jetpipe serve --bundle /tmp/det $(for i in $(seq $n); do echo --source $video; done) \
    --loop --realtime --duration 20 --metrics "" --summary $R/$label.json "$@" >/dev/null 2>$R/$label.err
  python - $R/$label.json $label <<'PY'
import json,sys; s=json.load(open(sys.argv[1]))["summary"]; t=s["latency_ms"]["total"]
print(f"{sys.argv[2]}: {s['throughput_fps']} fps p50 {t['0.5']} p99 {t['0.99']} dropped {sum(s['dropped'])} cores {s['cpu_cores']}")
PY
}
if [ "${PART:-1}" = 1 ]; then
  python -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/service/test_gpus_gpu.py 2>&1 | tail -3
  mk 200
  python scripts/bench_busy.py /tmp/det --video /tmp/words200.mp4 --words 200 --streams 32 --seconds 20 --repeats 2 \
    --variant 'workers2=--workers-per-gpu 2' --json $R/busy32_workers.json 2>&1 | python .dev/rows.py
fi
if [ "${PART:-1}" = 2 ]; then
  serve s32one 32 $V; serve s32w2 32 $V --workers-per-gpu 2
  if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
    nvidia-cuda-mps-control -d && echo "MPS on"
    serve s32w2mps 32 $V --workers-per-gpu 2
    python scripts/bench_busy.py /tmp/det --video /tmp/words200.mp4 --words 200 --streams 32 --seconds 20 --repeats 1 \
      --variant 'workers2=--workers-per-gpu 2' --json $R/busy32_mps.json 2>&1 | python .dev/rows.py
    echo quit | nvidia-cuda-mps-control; echo "MPS off"
  else echo "no MPS control on this machine"; fi
fi
