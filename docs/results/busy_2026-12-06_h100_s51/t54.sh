# NOT RUN (session 51's device time was spent). For the next lease, one H100: does 33f49a0 (NVDEC copies waited
# for on the GPU) cost --workers-per-gpu 2 under MPS anything? Lease 4 saw 912 frames/s, 18,332 of 19,200
# captured with it, against lease 1's 956 with the tree before, on possibly another machine. Send .dev/old =
# f2aa92f (the tree before) and the kits as for t53.sh; 32 live sparse streams, 20 s, MPS running, two pairs
# interleaved, then the same for 32 dense ones (500 words) once each.
set -u
R=$OUT/t54; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
[ -f /tmp/words500.mp4 ] || cp .dev/vid/words500.mp4 /tmp/
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
  -g 30 -pix_fmt yuv420p $V
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/sparse.txt
sparse() {  # $1 label, $2 tree
  (cd $2 && python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 32); do echo --source $V; done) --loop \
    --realtime --duration 20 --metrics "" --summary $R/$1.json --workers-per-gpu 2 >/dev/null 2>$R/$1.err)
  python - $R/$1.json $1 <<'PY' | tee -a $R/sparse.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(s["dropped"]), "p50", t["0.5"],
      "p99", t["0.99"], "cores", s["cpu_cores"])
PY
}
for k in 1 2; do sparse old_w2_$k $PWD/.dev/old; sparse new_w2_$k $PWD; done
python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
  --tree new=. --tree old=.dev/old --no-plain --variant 'workers2=--workers-per-gpu 2' --json $R/dense32_mps.json \
  2>&1 | tail -2 | cut -c1-300
echo quit | nvidia-cuda-mps-control; echo "MPS off"
