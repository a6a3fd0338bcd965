# issue 66, measure first (session 43): one serving process against two on the same GPU for targets 1-3.
# PART=1: prep, 300-word busy 16 streams, 200-word busy 32 streams one vs two of 16.
# PART=2: 96 overloaded (72 words, 66 ms budget) one vs two of 48, and 48 alone; 32 sparse one vs two of 16.
set -u
R=$OUT/m66; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet
V=/tmp/v40.mp4
[ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast -g 30 -pix_fmt yuv420p $V
RULES='--line left:0.3,0,0.3,1 --line right:0.7,0,0.7,1 --zone west:0,0,0.25,0,0.3,1,0,1 --zone east:0.75,0,1,0,1,1,0.75,1'
serve() { # $1 label $2 streams $3 video $4 bundle, rest: flags
  local label=$1 n=$2 video=$3 bundle=$4; shift 4
  python -m jetpipe serve --bundle $bundle $(for i in $(seq $n); do echo --source $video; done) \
    --loop --realtime --duration 20 --metrics "" --summary $R/$label.json "$@" >/dev/null 2>$R/$label.err
}
show() { python - $R "$@" <<'PY'
import json, sys
R, names = sys.argv[1], sys.argv[2:]
ss = [json.load(open(f"{R}/{n}.json"))["summary"] for n in names]
t = [s["latency_ms"]["total"] for s in ss]
print(f"{'+'.join(names)}: {sum(s['throughput_fps'] for s in ss):.1f} fps dropped {sum(sum(s['dropped']) for s in ss)} "
      f"p50 {'/'.join(str(x['0.5']) for x in t)} p99 {'/'.join(str(x['0.99']) for x in t)} "
      f"cores {'+'.join(str(s['cpu_cores']) for s in ss)} post_ms {'/'.join(str(s.get('post_thread_ms_per_batch')) for s in ss)}")
PY
}
if [ "${PART:-1}" = 1 ]; then
  mk 300; mk 200
  python scripts/bench_busy.py /tmp/det --video /tmp/words300.mp4 --words 300 --streams 16 --seconds 20 --repeats 1 \
    --json $R/busy300_16.json 2>&1 | tail -3
  serve b32one 32 /tmp/words200.mp4 /tmp/det $RULES --sink jsonl:/tmp/b.jsonl; rm -f /tmp/b.jsonl; show b32one
  serve b32A 16 /tmp/words200.mp4 /tmp/det $RULES --sink jsonl:/tmp/a.jsonl & serve b32B 16 /tmp/words200.mp4 /tmp/det $RULES --sink jsonl:/tmp/b.jsonl & wait
  rm -f /tmp/a.jsonl /tmp/b.jsonl; show b32A b32B
fi
if [ "${PART:-1}" = 2 ]; then
  mk 72
  B="--latency-budget-ms 66"
  serve o96one 96 /tmp/words72.mp4 /tmp/det $B; show o96one
  serve o96A 48 /tmp/words72.mp4 /tmp/det $B & serve o96B 48 /tmp/words72.mp4 /tmp/det $B & wait; show o96A o96B
  serve o48one 48 /tmp/words72.mp4 /tmp/det $B; show o48one
  serve s32one 32 $V /tmp/det; show s32one
  serve s32A 16 $V /tmp/det & serve s32B 16 $V /tmp/det & wait; show s32A s32B
fi
