# issue 66, session 46, one H200 lease. This tree = 5f578a7 (botsort's ring history, Kalman blocks apart, the
# sweep's axis kept, the solver's one buffer); .dev/old = 6aec4d5 (session 45's last); .dev/old5 = 9ad54be (before
# issue 66's speed work: target 5's "not worse" is against it). PART=1: bundles and the GPU tests the tracker
# touches; PART=2: target 4 (bench_post both trees on the host's cores, then 16 dense streams in the daemon, both
# trees interleaved); PART=3: target 5 (16 live sparse streams' p99, the OCR chain, the light detector).
set -u
R=$OUT/t66f; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
nproc | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
if [ "${PART:-1}" = 1 ]; then
  python -c "import PyNvVideoCodec, onnxruntime as o; print('nvdec ok', o.get_available_providers())" 2>&1 | tee -a $R/gpu.txt
  python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1; ls /tmp/det
  python -m jetpipe convert ppocr-rec -o /tmp/rec --quiet >/dev/null 2>&1; ls /tmp/rec
  python -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/core tests/pipelines/service/test_daemon_gpu.py 2>&1 | tail -4
fi
if [ "${PART:-1}" = 2 ]; then
  mk 200; mk 500
  cp scripts/bench_post.py .dev/old/scripts/bench_post.py
  for i in 1 2; do for t in . .dev/old; do
    echo -n "post $t: "
    python $t/scripts/bench_post.py /tmp/det --video /tmp/words200.mp4 --frames 300 --rounds 300 --repeats 1 \
      --json $R/post_$(basename $(realpath $t))_$i.json 2>&1 | tail -1 | cut -c1-330
  done; done
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 16 --seconds 20 --repeats 2 \
    --tree new=. --tree old=.dev/old --json $R/dense500.json 2>&1 | tail -4 | cut -c1-600
fi
if [ "${PART:-1}" = 3 ]; then
  V=/tmp/v40.mp4; W=/tmp/words200.mp4
  [ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast -g 30 -pix_fmt yuv420p $V
  run() { # $1 tree, $2 label, $3.. serve flags
    local tree=$1 label=$2; shift 2
    (cd $tree && PYTHONPATH=$PWD:/tmp/site python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" \
       --summary $R/$label.json >/dev/null 2>$R/$label.err)
    python - $R/$label.json $label <<'PY'
import json,sys; s=json.load(open(sys.argv[1]))["summary"]; t=s["latency_ms"]["total"]
print(f"{sys.argv[2]}: {s['throughput_fps']} fps p50 {t['0.5']} p99 {t['0.99']} dropped {sum(s['dropped'])} cores {s['cpu_cores']}")
PY
  }
  N=$PWD; O=$PWD/.dev/old5
  SPARSE="$(for i in $(seq 16); do echo --source $V; done) --loop --realtime"
  OCR="$(for i in $(seq 8); do echo --source $W; done) --loop --secondary /tmp/rec"
  for k in 1 2; do
    run $N sparse16-new$k $SPARSE; run $O sparse16-old$k $SPARSE
    run $O ocr8-old$k $OCR; run $N ocr8-new$k $OCR
  done
  for t in . .dev/old5; do echo "light $t:"
    python $t/scripts/bench_light.py .dev/light/320n.onnx --streams 32 --seconds 15 --decode-processes auto \
      --json $R/light_$(basename $(realpath $t)).json 2>&1 | tail -3 | cut -c1-300
  done
fi
