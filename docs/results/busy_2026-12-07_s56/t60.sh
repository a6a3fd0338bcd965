# Session 56, one lease.
# PART=T: the GPU tests of the network NVDEC path (nvdec_pipe.py's probe of two frames; session 55's last edit to
#   PipeDemuxer), then recording and clips (not re-run after session 55's flush packet).
# PART=P: 16 network cameras of the 72-word video (bench_busy.py --network --remux-shim), this tree against the one
#   before (.dev/old = 2629e10), interleaved, REPEATS a tree; missing_at_start: the frames of each camera's first
#   2 s with no record (what its opening gave at once and the queue dropped).
set -u
R=$OUT/t60; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
if [ "${PART:-T}" = T ]; then
  for f in "tests/pipelines/ingest/test_video_gpu.py -k network" tests/pipelines/outputs/test_recording_gpu.py \
      tests/pipelines/outputs/test_clips_gpu.py; do
    timeout 250 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -3 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-T}" = P ]; then
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
  [ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 \
    --repeats ${REPEATS:-2} --network --remux-shim --tree new=. --tree old=.dev/old --json $R/pipe.json > $R/pipe.txt 2>&1
  python - $R/pipe.json <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["run"], r["fps"], "dropped", r["dropped"], "missing_at_start", r.get("missing_at_start"), "p50", r["p50_ms"],
          "p99", r["p99_ms"], "tracked", r["tracked_per_frame"], "us/object", r["serving_us_per_object"], "post busy",
          r["post_thread_busy_share"], "gpu", r["gpu_busy_share"], "cpu", r["cpu_seconds"])
PY
fi
# PART=F: the same 16 streams as looped --realtime files, this tree (run in the same lease after P and T).
if [ "${PART:-T}" = F ]; then
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 --repeats 1 \
    --json $R/files.json > $R/files.txt 2>&1
fi
# PART=S (a second lease): where the frames missing at the start are (bench_busy's missing_frame_numbers: frame
#   number -> cameras), 16 network cameras, this tree, one run; with SPY=1 first one with py-spy (the GIL holders: the
#   sources' CPU is still twice the files').
if [ "${PART:-T}" = S ]; then
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
  [ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
  for spy in ${SPY:+"--py-spy $R/spy"} ""; do
    mkdir -p $R/spy
    python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 --repeats 1 \
      --network --remux-shim $spy --json $R/start${spy:+_spy}.json > $R/start${spy:+_spy}.txt 2>&1
    python - $R/start${spy:+_spy}.json <<'PY' | tee -a $R/runs_s.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["run"], r["fps"], "dropped", r["dropped"], "missing_at_start", r["missing_at_start"],
          r["missing_frame_numbers"], "p99", r["p99_ms"], "cpu", r["cpu_seconds"])
PY
  done
fi
