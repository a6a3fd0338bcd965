# issue 67, session 48, one lease: the recording's packets copied into a shared arena (this tree) against f7aa956
# (.dev/old: each packet kept as bytes in the serving process's ring, then pickled over the pipe).
# PART=1: the bundle and the GPU tests that recording and clips touch; PART=3: 16 live 1080p30 NVDEC streams
# of the 72-word video, 30 s a run, two repeats, arms interleaved: this tree plain and with --record, f7aa956
# with --record (bench_busy.py: 4 rules, a jsonl sink, the CLI's defaults otherwise). NOPLAIN=--no-plain: the
# recording arms only. The old tree: mkdir -p .dev/old && git archive f7aa956 jetpipe scripts pyproject.toml |
# tar -x -C .dev/old (send .dev/old along with .dev/kit and .dev/ff).
set -u
R=$OUT/t67c; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
nproc | tee -a $R/gpu.txt
[ -f /tmp/words72.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words72.mp4'), 20.0, 72)"
if [ "${PART:-1}" = 1 ]; then
  python -c "import PyNvVideoCodec, av, onnxruntime as o; print('nvdec ok', av.__version__, o.get_available_providers())" 2>&1 | tee -a $R/gpu.txt
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1; ls /tmp/det
  # each file within its own bound (a first try hung: a decode process's batch lacked add_from, and its stream
  # reopened until the call's limit)
  for f in ${TESTS:-tests/pipelines/outputs/test_recording_gpu.py tests/pipelines/outputs/test_clips_gpu.py \
           tests/pipelines/service/test_gpus_gpu.py tests/pipelines/service/test_daemon_gpu.py}; do
    timeout 150 python -m pytest -q -p no:cacheprovider -m gpu $f >> $R/gpu_tests.txt 2>&1; echo "$f rc=$?" >> $R/gpu_tests.txt
  done
  grep -E "rc=|passed|failed" $R/gpu_tests.txt
fi
if [ "${PART:-1}" = 3 ]; then
  rm -rf /tmp/rec; mkdir -p /tmp/rec
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 30 --repeats 2 \
    --tree new=. --tree old=.dev/old --variant 'record=--record /tmp/rec --record-max-size 20GB' ${NOPLAIN:-} \
    --json $R/record72.json > $R/bench.txt 2>&1
  python - $R/record72.json <<'PY' | tee $R/table.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec = r.get("recording") or {}
    c = r["cpu_seconds"]
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "rec_proc", c.get("recording_process"),
          {k: rec.get(k) for k in ("segments", "failed", "lost_gops", "unkept_packets", "rings_s", "forwarding_s",
                                   "serving_process_s", "recording_process_s")})
PY
fi
