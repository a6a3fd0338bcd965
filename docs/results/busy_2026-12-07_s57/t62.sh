# Session 57, a second lease.
# PART=L: NVDEC's display latency (scripts/diag/nvdec_latency.py): packets given one at a time, how many frames the
#   decoder holds with each of PyNvVideoCodec's settings (default, NATIVE, LOW, ZERO), whether they come out in
#   display order, and whether the first Decode (the decoder made) holds the GIL. Two videos: testsrc2 without
#   B-frames (as most IP cameras send), the 72-word video with them (x264's defaults).
# PART=P: 16 network cameras of the 72-word video (bench_busy.py --network --remux-shim), this tree (live streams'
#   decoders made with latency LOW) against .dev/old (7eddbf4: the default), interleaved, REPEATS a tree; the
#   frames' time behind the camera (behind_camera_ms: capture time against the camera's send), missing at start.
# PART=G: the GPU test of the change (a camera silent after its first 12 frames: NVDEC gives them) on this tree and on
#   a copy whose display_latency() asks for nothing (the default, as before: it should fail there), then the network
#   NVDEC tests.
set -u
R=$OUT/t62; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
if [ "${PART:-L}" = L ]; then
  python scripts/diag/nvdec_latency.py .dev/vid/nob.mp4 .dev/vid/words72.mp4 --packets 120 --repeats 2 2>&1 \
    | tee $R/nvdec_latency.txt
fi
if [ "${PART:-L}" = P ]; then
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
  [ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 \
    --repeats ${REPEATS:-2} --network --remux-shim --tree new=. --tree old=.dev/old --json $R/pipe.json > $R/pipe.txt 2>&1
  python - $R/pipe.json <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["run"], r["fps"], "dropped", r["dropped"], "missing_at_start", r["missing_at_start"], "p50", r["p50_ms"],
          "p99", r["p99_ms"], "behind camera", r.get("behind_camera_ms"), "cpu", r["cpu_seconds"])
PY
fi
if [ "${PART:-L}" = G ]; then
  t=tests/pipelines/ingest/test_video_gpu.py
  timeout 120 python -m pytest -m gpu -q -p no:cacheprovider $t -k not_a_frame_late 2>&1 | tail -3 | tee -a $R/tests.txt
  rm -rf /tmp/before && mkdir /tmp/before && tar --exclude=./.dev -cf - . | tar -xf - -C /tmp/before
  sed -i 's/    if not live or kinds is None or not hasattr(kinds, "LOW"):/    if True:  # as before/' \
    /tmp/before/jetpipe/runtime/nvdec.py
  (cd /tmp/before && timeout 120 python -m pytest -m gpu -q -p no:cacheprovider $t -k not_a_frame_late 2>&1 \
    | grep -E "passed|failed|assert|timed out" | tail -4 | sed 's/^/before: /' | tee -a $R/tests.txt)
  timeout 250 python -m pytest -m gpu -q -p no:cacheprovider $t -k network 2>&1 | tail -3 | tee -a $R/tests.txt
fi
