# issue 66 target 5 on one warm H200: the tree before this session's speed work (.dev/old = 9ad54be) and this
# one, interleaved: 16 live sparse 1080p30 streams (CLI defaults: p99), and the OCR chain (det -> rec) on 8
# looping files of the busy words video, saturated (frames/s).
set -u
R=$OUT/target5; mkdir -p $R
V=/tmp/v40.mp4; W=/tmp/words200.mp4
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast -g 30 -pix_fmt yuv420p $V
[ -f $W ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('$W'), 20.0, 200)"
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet
[ -d /tmp/rec ] || python -m jetpipe convert ppocr-rec -o /tmp/rec --quiet
run() { # $1 tree, $2 label, $3.. serve flags
  local tree=$1 label=$2; shift 2
  (cd $tree && PYTHONPATH=$PWD:/tmp/site python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" \
     --summary $R/$label.json >/dev/null 2>$R/$label.err)
  python - $R/$label.json $label <<'PY'
import json,sys; s=json.load(open(sys.argv[1]))["summary"]; t=s["latency_ms"]["total"]
print(f"{sys.argv[2]}: {s['throughput_fps']} fps p50 {t['0.5']} p99 {t['0.99']} dropped {sum(s['dropped'])} cores {s['cpu_cores']}")
PY
}
N=$PWD; O=$PWD/.dev/old
SPARSE="$(for i in $(seq 16); do echo --source $V; done) --loop --realtime"
OCR="$(for i in $(seq 8); do echo --source $W; done) --loop --secondary /tmp/rec"
for k in 1 2; do
  run $N sparse16-new$k $SPARSE; run $O sparse16-old$k $SPARSE
  run $O ocr8-old$k $OCR; run $N ocr8-new$k $OCR
done
