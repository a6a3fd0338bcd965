# Session 52, one H100 lease. This tree = e4edf5f (33f49a0: NVDEC frame copies waited for on the GPU); .dev/old =
# f2aa92f (the tree before 33f49a0). PART=A: session 51's t54 (two workers under MPS, 32 live sparse streams, two
# pairs interleaved; 32 dense ones, one pair). PART=B: issue 66 target 5 against the tree before 33f49a0: 16 live
# sparse streams' p99, the OCR chain (8 words200 files, det -> rec), the light detector (YOLOv8n at 320, 32 NVDEC
# files, decode_processes auto), two pairs interleaved (the light detector once a tree).
set -u
R=$OUT/t55; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
  -g 30 -pix_fmt yuv420p $V
for w in 200 500; do [ -f /tmp/words$w.mp4 ] || cp .dev/vid/words$w.mp4 /tmp/; done
N=$PWD; O=$PWD/.dev/old
run() { # $1 tree, $2 label, $3.. serve flags
  local tree=$1 label=$2; shift 2
  (cd $tree && PYTHONPATH=$PWD:/tmp/site python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" \
     --summary $R/$label.json >/dev/null 2>$R/$label.err)
  python - $R/$label.json $label <<'PY' | tee -a $R/runs.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(s["dropped"]), "p50", t["0.5"],
      "p99", t["0.99"], "cores", s["cpu_cores"])
PY
}
if [ "${PART:-A}" = A ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/runs.txt
  S32="$(for i in $(seq 32); do echo --source $V; done) --loop --realtime --workers-per-gpu 2"
  for k in 1 2; do run $O old_w2_mps_$k $S32; run $N new_w2_mps_$k $S32; done
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
    --tree new=. --tree old=.dev/old --no-plain --variant 'workers2=--workers-per-gpu 2' --json $R/dense32_mps.json \
    2>&1 | tail -2 | cut -c1-300 | tee -a $R/runs.txt
  echo quit | nvidia-cuda-mps-control; echo "MPS off" | tee -a $R/runs.txt
fi
if [ "${PART:-A}" = B ]; then
  [ -d /tmp/rec ] || python -m jetpipe convert ppocr-rec -o /tmp/rec --quiet >/dev/null 2>&1
  S16="$(for i in $(seq 16); do echo --source $V; done) --loop --realtime"
  OCR="$(for i in $(seq 8); do echo --source /tmp/words200.mp4; done) --loop --secondary /tmp/rec"
  for k in 1 2; do
    run $O sparse16_old_$k $S16; run $N sparse16_new_$k $S16
    run $N ocr8_new_$k $OCR; run $O ocr8_old_$k $OCR
  done
  for t in . .dev/old; do echo "light $t:" | tee -a $R/runs.txt
    python $t/scripts/bench_light.py .dev/light/320n.onnx --streams 32 --seconds 15 --decode-processes auto \
      --json $R/light_$(basename $(realpath $t)).json 2>&1 | tail -3 | cut -c1-300 | tee -a $R/runs.txt
  done
fi
