# issue 67, session 47, one H200 lease: recording in a process of its own (this tree) against f0deee0 (.dev/old:
# recording in a thread of the serving process). PART=1: the bundle and the GPU tests recording and clips touch;
# PART=2: 16 live 1080p30 streams of the 72-word video (session 42's cost run), each tree plain and with --record,
# interleaved, 30 s a run, two repeats (bench_busy.py: 4 rules, a jsonl sink, the CLI's defaults otherwise).
set -u
R=$OUT/t67b; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
nproc | tee -a $R/gpu.txt
if [ "${PART:-1}" = 1 ]; then
  python -c "import PyNvVideoCodec, av, onnxruntime as o; print('nvdec ok', av.__version__, o.get_available_providers())" 2>&1 | tee -a $R/gpu.txt
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1; ls /tmp/det
  python -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/outputs/test_recording_gpu.py tests/pipelines/outputs/test_clips_gpu.py \
    tests/pipelines/service/test_gpus_gpu.py tests/pipelines/service/test_daemon_gpu.py 2>&1 | tail -5
fi
[ -f /tmp/words72.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words72.mp4'), 20.0, 72)"
if [ "${PART:-1}" = 2 ]; then
  rm -rf /tmp/rec; mkdir -p /tmp/rec
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 30 --repeats 2 \
    --tree new=. --tree old=.dev/old --variant 'record=--record /tmp/rec --record-max-size 20GB' \
    --json $R/record72.json 2>&1 | tail -8 | cut -c1-400
  python - $R/record72.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec = r.get("recording") or {}
    c = r["cpu_seconds"]
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "rec_proc", c.get("recording_process"),
          "decode_procs", c.get("decode_processes"),
          {k: rec.get(k) for k in ("segments", "failed", "lost_gops", "cpu_s", "writing_s", "rings_s", "forwarding_s",
                                   "serving_process_s", "recording_process_s")})
PY
fi
if [ "${PART:-1}" = 3 ]; then
  # after the first run: the rings' CPU sampled at random (every 8th packet over-counted the GOPs' even places);
  # the recording arms only, then the start-up drops: the same tree at . and at a copy of it (.dev/same), plain
  rm -rf /tmp/rec; mkdir -p /tmp/rec
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 30 --repeats 2 \
    --tree new=. --tree old=.dev/old --variant 'record=--record /tmp/rec --record-max-size 20GB' --no-plain \
    --json $R/record72b.json 2>&1 | grep record | cut -c1-300
  python - $R/record72b.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec = r.get("recording") or {}
    c = r["cpu_seconds"]
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "rec_proc", c.get("recording_process"),
          {k: rec.get(k) for k in ("segments", "failed", "lost_gops", "cpu_s", "writing_s", "rings_s", "forwarding_s",
                                   "serving_process_s", "recording_process_s")})
PY
fi
if [ "${PART:-1}" = 4 ]; then
  mkdir -p .dev/same && tar --exclude=./.dev -cf - . | tar -xf - -C .dev/same
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 --repeats 2 \
    --tree here=. --tree copy=.dev/same --json $R/where72.json 2>&1 | cut -c1-200
fi
if [ "${PART:-1}" = 5 ]; then
  # with clips on, the rings are the clips' anyway: what --record adds beside --clips (this tree, one pair)
  rm -rf /tmp/rec /tmp/clips; mkdir -p /tmp/rec /tmp/clips
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 --repeats 1 \
    --no-plain --variant 'clips=--clips /tmp/clips' --variant 'clipsrecord=--clips /tmp/clips --record /tmp/rec --record-max-size 20GB' \
    --json $R/clips_record72.json 2>&1 | cut -c1-200
  python - $R/clips_record72.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec = r.get("recording") or {}
    c = r["cpu_seconds"]
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "rec_proc", c.get("recording_process"),
          {k: rec.get(k) for k in ("segments", "failed", "lost_gops", "rings_s", "forwarding_s", "serving_process_s")})
PY
fi
