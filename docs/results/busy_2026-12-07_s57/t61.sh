# Session 57, one lease.
# PART=T: the GPU tests of the network NVDEC path, recording and clips, on session 56's final tree (its GPU tests ran
#   on 6bb3c27; fd1fbb9..7eddbf4 changed the remux's and ffprobe's flags and the FFmpeg source's threads after).
# PART=S: where the frames missing at a camera's start fall (bench_busy's missing_frame_numbers: frame number ->
#   cameras), 16 network cameras of the 72-word video, this tree, one plain run; then one network run and one looped-
#   files run, each under py-spy sampling every thread on CPU (--py-spy-all-threads): the network sources' CPU is
#   twice the files' (4.9-5.2 against 2.3 s, session 56) and not yet profiled; then another plain network run.
#   (Run first with --native, which stops the process at each sample and broke the run: t61/runs_s_native_spy.txt;
#   then with --nonblocking, what --py-spy-all-threads passes now: t61/.)
set -u
R=$OUT/t61; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
if [ "${PART:-T}" = T ]; then
  for f in "tests/pipelines/ingest/test_video_gpu.py -k network" tests/pipelines/outputs/test_recording_gpu.py \
      tests/pipelines/outputs/test_clips_gpu.py; do
    timeout 250 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -3 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-T}" = S ]; then
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
  [ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
  mkdir -p $R/spy
  for arm in "start --network --remux-shim" "spy_net --network --remux-shim --py-spy $R/spy/net --py-spy-all-threads" \
      "spy_files --py-spy $R/spy/files --py-spy-all-threads" "start2 --network --remux-shim"; do
    set -- $arm; name=$1; shift
    python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 --repeats 1 \
      "$@" --json $R/$name.json > $R/$name.txt 2>&1
    python - $R/$name.json $name <<'PY' | tee -a $R/runs_s.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "missing_at_start", r["missing_at_start"],
          r["missing_frame_numbers"], "p99", r["p99_ms"], "cpu", r["cpu_seconds"], "said", r["overload_said"])
PY
  done
  (cd $R/spy && tar czf ../spy.tgz . && cd .. && rm -rf spy)
fi
