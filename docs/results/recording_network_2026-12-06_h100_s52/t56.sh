# Session 52, one H100 lease: issue 67's cost with the packets teed past the serving process (recording/teed.py).
# This tree = the tee; .dev/old = e4edf5f (each packet copied into an arena by the source's thread).
# PART=T: the GPU tests the tee touches (recording on NVDEC, a network stream's teed recording, the network NVDEC
#   tests), and whether this machine's ffmpeg reads a socket.
# PART=R: 16 network cameras (bench_busy.py --network: the 72-word 1080p30 video as MPEG-TS over TCP, real time),
#   NVDEC through the remux command, 4 rules, a jsonl sink, --record, 30 s; both trees, two rounds interleaved.
set -u
R=$OUT/t56; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
[ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
python -c "import av; print('PyAV', av.__version__)" | tee -a $R/gpu.txt
if [ "${PART:-T}" = T ]; then
  python - <<'PY' 2>&1 | tee -a $R/gpu.txt
import socket, subprocess, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
threading.Thread(target=lambda: s.accept()[0].sendall(open("/tmp/words72.mp4", "rb").read()[:1]), daemon=True).start()
r = subprocess.run(["ffmpeg", "-v", "error", "-i", f"tcp://127.0.0.1:{s.getsockname()[1]}", "-f", "null", "-"],
                   capture_output=True, timeout=30)
print("ffmpeg on a socket: exit", r.returncode, r.stderr[-200:])
PY
  for f in tests/pipelines/outputs/test_recording_gpu.py "tests/pipelines/ingest/test_video_gpu.py -k network"; do
    timeout 300 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -4 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-T}" = R ]; then
  K=${K:-1}
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 30 --repeats ${REPEATS:-2} \
    --network --remux-shim --tree new=. --tree old=.dev/old --no-plain \
    --variant "record=--record /tmp/rec$K --record-max-size 20GB" \
    --json $R/net16_$K.json > $R/bench_$K.txt 2>&1
  tail -3 $R/bench_$K.txt | cut -c1-200
  python - $R/net16_$K.json <<'PY' | tee -a $R/table.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rec, c = r.get("recording") or {}, r["cpu_seconds"]
    share = rec.get("serving_process_s", 0) / c["process"] if c.get("process") else None
    print(r["run"], r["fps"], r["dropped"], r["p99_ms"], "process", c.get("process"), "sources", c.get("sources"),
          "share", share and round(100 * share, 2), {k: rec.get(k) for k in ("segments", "failed", "teed_streams",
          "unkept_packets", "rings_s", "forwarding_s", "serving_process_s", "recording_process_s")})
PY
fi
