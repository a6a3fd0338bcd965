# Session 50's second lease (one H100). Send .dev/old = aa5f03e (the tree before the arena's copy kept the GIL):
#   mkdir -p .dev/old && git archive aa5f03e jetpipe scripts pyproject.toml | tar -x -C .dev/old
# PART=R: issue 67's cost: 16 live 1080p30 NVDEC streams of the 72-word video, 30 s a run, two repeats, arms
#   interleaved: each tree plain and with --record (bench_busy.py: 4 rules, a jsonl sink, CLI defaults otherwise).
# PART=O: issue 66 target 2, measure first: 48, 96 and 128 overloaded live streams of the 72-word video, 66 ms
#   budget, 20 s each, this tree; the GPU's engines each second (nvidia-smi dmon: SM, memory, NVDEC) beside each
#   run, and py-spy's stacks of the 96-stream run's serving process (needs the extra kit).
# PART=S: issue 66 target 3: 32 live sparse 1080p30 streams (testsrc2), CLI defaults, 20 s, two runs; then target 1's
#   second half: 32 dense live streams (500 words, tracker + 4 rules + jsonl) in one process, one run.
# PART=P: the same two runs (one each) with the streams decoded in a decode process (--decode-processes 1): PyNvVideoCodec's
#   decoding holds the serving process's GIL ~0.4 ms a frame.
set -u
R=$OUT/t50; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
mk 72
if [ "${PART:-R}" = R ]; then
  rm -rf /tmp/rec; mkdir -p /tmp/rec
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 30 --repeats 2 \
    --tree new=. --tree old=.dev/old --variant 'record=--record /tmp/rec --record-max-size 20GB' \
    --json $R/record72.json > $R/bench.txt 2>&1
  python - $R/record72.json <<'PY' | tee $R/table.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec, c = r.get("recording") or {}, r["cpu_seconds"]
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "sources", c.get("sources"),
          "rec_proc", c.get("recording_process"), {k: rec.get(k) for k in ("segments", "failed", "unkept_packets",
          "rings_s", "forwarding_s", "serving_process_s")})
PY
fi
if [ "${PART:-R}" = O ]; then
  for n in ${COUNTS:-48 96 128}; do
    nvidia-smi dmon -s u -d 1 > $R/dmon$n.txt 2>&1 & DMON=$!
    python -m jetpipe serve --bundle /tmp/det $(for i in $(seq $n); do echo --source /tmp/words72.mp4; done) \
      --loop --realtime --duration 20 --metrics "" --latency-budget-ms 66 --summary $R/o$n.json >/dev/null 2>$R/o$n.err &
    SERVE=$!
    PYSPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)  # the extra kit puts it in /tmp/site/bin
    if [ $n = 96 ] && [ -x $PYSPY ]; then
      sleep 8; $PYSPY record --nonblocking --format raw --rate 50 --duration 10 --pid $SERVE -o $R/o96.stacks \
        > $R/pyspy.log 2>&1
    fi
    wait $SERVE; kill $DMON
    python - $R/o$n.json <<'PY' | tee -a $R/overload.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print(sys.argv[1].split("/")[-1], s["throughput_fps"], "dropped", sum(s["dropped"]), "p99", s["latency_ms"]["total"]["0.99"],
      "gpu_busy", s.get("gpu_busy_share"), "post_busy", s.get("post_thread_busy_share"), "cores", s["cpu_cores"],
      "cpu_s", s.get("cpu_seconds"), "batches", s.get("batches"))
PY
  done
  tar -czf $R/overload${TAG:-}.tgz -C $R $(cd $R && ls o*.json o*.err dmon*.txt o96.stacks pyspy.log 2>/dev/null) && \
    (cd $R && rm -f o*.json o*.err dmon*.txt o96.stacks pyspy.log)
fi
if [ "${PART:-R}" = S ]; then
  V=/tmp/v40.mp4
  [ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
    -g 30 -pix_fmt yuv420p $V
  for k in 1 2; do
    python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 32); do echo --source $V; done) --loop --realtime \
      --duration 20 --metrics "" --summary $R/s32_$k.json >/dev/null 2>$R/s32_$k.err
    python - $R/s32_$k.json <<'PY' | tee -a $R/sparse.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print(sys.argv[1].split("/")[-1], s["throughput_fps"], "dropped", sum(s["dropped"]), "p50", s["latency_ms"]["total"]["0.5"],
      "p99", s["latency_ms"]["total"]["0.99"], "gpu_busy", s.get("gpu_busy_share"), "cores", s["cpu_cores"])
PY
  done
  mk 500
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
    --json $R/dense32.json 2>&1 | tail -2 | cut -c1-700
fi
if [ "${PART:-R}" = P ]; then
  mk 500
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
    --variant 'dp1=--decode-processes 1' --no-plain --json $R/dense32_dp1.json 2>&1 | tail -1 | cut -c1-700
  V=/tmp/v40.mp4
  [ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
    -g 30 -pix_fmt yuv420p $V
  python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 32); do echo --source $V; done) --loop --realtime \
    --duration 20 --metrics "" --decode-processes 1 --summary $R/s32_dp1.json >/dev/null 2>$R/s32_dp1.err
  python - $R/s32_dp1.json <<'PY' | tee -a $R/sparse.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print(sys.argv[1].split("/")[-1], s["throughput_fps"], "dropped", sum(s["dropped"]), "p50", s["latency_ms"]["total"]["0.5"],
      "p99", s["latency_ms"]["total"]["0.99"], "gpu_busy", s.get("gpu_busy_share"), "cores", s["cpu_cores"])
PY
fi
