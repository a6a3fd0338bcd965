# issue 66, measure first: 16 busy live streams in one serving process, against two processes of 8 on the same
# GPU at once (what a worker per half of the streams would do: a GIL each). Interleaved, twice.
set -u
R=$OUT/split; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet
[ -f /tmp/words200.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words200.mp4'), 20.0, 200)"
RULES='--line left:0.3,0,0.3,1 --line right:0.7,0,0.7,1 --zone west:0,0,0.25,0,0.3,1,0,1 --zone east:0.75,0,1,0,1,1,0.75,1'
serve() { # $1 streams, $2 label
  python -m jetpipe serve --bundle /tmp/det $(for i in $(seq $1); do echo --source /tmp/words200.mp4; done) \
    --loop --realtime --duration 20 --metrics "" $RULES --sink jsonl:/tmp/$2.jsonl --summary $R/$2.json \
    >/dev/null 2>$R/$2.err; rm -f /tmp/$2.jsonl
}
for k in 1 2; do
  serve 16 one16-$k
  serve 8 twoA-$k & serve 8 twoB-$k & wait
done
python - $R <<'PY'
import json, sys, glob
R = sys.argv[1]
def s(name): return json.load(open(f"{R}/{name}.json"))["summary"]
for k in (1, 2):
    one = s(f"one16-{k}"); a, b = s(f"twoA-{k}"), s(f"twoB-{k}")
    t = lambda x: x["latency_ms"]["total"]
    print(f"one process  : {one['throughput_fps']} fps dropped {sum(one['dropped'])} p50 {t(one)['0.5']} p99 {t(one)['0.99']} cores {one['cpu_cores']}")
    print(f"two processes: {a['throughput_fps'] + b['throughput_fps']:.1f} fps dropped {sum(a['dropped']) + sum(b['dropped'])} "
          f"p50 {t(a)['0.5']}/{t(b)['0.5']} p99 {t(a)['0.99']}/{t(b)['0.99']} cores {a['cpu_cores']}+{b['cpu_cores']}")
PY
