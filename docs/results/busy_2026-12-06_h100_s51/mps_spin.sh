# Session 51: where the NVDEC sources' threads spend 130 CPU-seconds in 20 s under CUDA MPS (7 without it): 32 live
# sparse streams in one process, py-spy's native stacks of the serving process twice mid-run, without and with
# MPS. Needs the extra kit (py-spy) and ffmpeg.
set -u
R=$OUT/spin; mkdir -p $R
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
  -g 30 -pix_fmt yuv420p $V
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
run() {  # $1 label
  python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 32); do echo --source $V; done) --loop --realtime \
    --duration 22 --metrics "" --summary $R/$1.json >/dev/null 2>$R/$1.err &
  local pid=$!
  sleep 12; $SPY dump --native --pid $pid > $R/$1_dump1.txt 2>&1; sleep 2; $SPY dump --native --pid $pid > $R/$1_dump2.txt 2>&1
  top -b -H -n 1 -p $pid | head -40 > $R/$1_top.txt
  wait $pid
  python -c "import json,sys; s=json.load(open('$R/$1.json'))['summary']; print('$1', s['throughput_fps'], sum(s['captured']), s['cpu_seconds'])" | tee -a $R/runs.txt
}
run nomps
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/runs.txt
run mps
echo quit | nvidia-cuda-mps-control
