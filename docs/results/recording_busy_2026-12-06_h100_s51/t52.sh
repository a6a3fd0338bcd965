# Session 51's lease (one H100). Send .dev/old = 74f53fc (the tree before a recording arena read NVDEC packets'
# fields in its forwarding thread):  mkdir -p .dev/old && git archive 74f53fc jetpipe scripts pyproject.toml | tar -x -C .dev/old
# PART=T: the GPU tests this change touches (NVDEC's packets into a recording's arena and a clips ring).
# PART=R: issue 67's cost: 16 live 1080p30 NVDEC streams of the 72-word video, --record, 30 s a run, two repeats,
#   the two trees interleaved (bench_busy.py: 4 rules, a jsonl sink, CLI defaults otherwise).
# PART=B: issue 66 target 3: 32 live sparse 1080p30 streams (testsrc2) at batches of 8, 16 and 32 frames (one bundle
#   converted with --max-batch 32; serve --max-batch N), 20 s each, two rounds interleaved.
set -u
R=$OUT/t52; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
[ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
if [ "${PART:-R}" = T ]; then
  for f in tests/pipelines/ingest/test_video_gpu.py::test_nvdecs_packets_each_their_own_so_a_recordings_arena_reads_their_fields_after_their_bytes \
      tests/pipelines/outputs/test_recording_gpu.py tests/pipelines/outputs/test_clips_gpu.py; do
    timeout 200 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -3 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-R}" = R ]; then
  rm -rf /tmp/rec; mkdir -p /tmp/rec
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 30 --repeats 2 \
    --tree new=. --tree old=.dev/old --no-plain --variant 'record=--record /tmp/rec --record-max-size 20GB' \
    --json $R/record72.json > $R/bench.txt 2>&1
  python - $R/record72.json <<'PY' | tee $R/table.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec, c = r.get("recording") or {}, r["cpu_seconds"]
    share = rec.get("serving_process_s", 0) / c["process"] if c.get("process") else None
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "sources", c.get("sources"),
          "share", share and round(100 * share, 2), {k: rec.get(k) for k in ("segments", "failed", "unkept_packets",
          "rings_s", "forwarding_s", "serving_process_s", "recording_process_s")})
PY
fi
if [ "${PART:-R}" = B ]; then
  [ -d /tmp/det32 ] || python -m jetpipe convert ppocr-det -o /tmp/det32 --max-batch 32 --quiet >/dev/null 2>&1
  V=/tmp/v40.mp4
  [ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
    -g 30 -pix_fmt yuv420p $V
  for round in 1 2; do for b in 8 16 32; do
    python -m jetpipe serve --bundle /tmp/det32 --max-batch $b $(for i in $(seq 32); do echo --source $V; done) --loop \
      --realtime --duration 20 --metrics "" --summary $R/b${b}_$round.json >/dev/null 2>$R/b${b}_$round.err
    python - $R/b${b}_$round.json b${b}_$round <<'PY' | tee -a $R/batches.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; L = s["latency_ms"]
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(s["dropped"]), "batches", s["batches"],
      "gpu_busy", s.get("gpu_busy_share"), {k: (L[k]["0.5"], L[k]["0.99"]) for k in L}, "cores", s["cpu_cores"])
PY
  done; done
fi
