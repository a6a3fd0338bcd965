# issue 67 with several workers, on one H200 (session 46): 16 live 1080p30 NVDEC streams served by two workers on
# GPU 0 (--workers-per-gpu 2), recorded with a line and clips; then what each worker's part holds, and the GPU
# tests of the face and of recording.
set -u
R=$OUT/t67; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
V=/tmp/words200.mp4
[ -f $V ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('$V'), 20.0, 200)"
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
rm -rf /tmp/rec /tmp/clips
python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 16); do echo --source $V; done) --loop --realtime \
  --workers-per-gpu 2 --record /tmp/rec --record-max-size 2GB --clips /tmp/clips --line door:0.5,0,0.5,1 \
  --duration 30 --metrics "" --summary $R/summary.json > /dev/null 2> $R/serve.err
echo "serve exit $?"
python - <<'PY'
import json, sqlite3
from pathlib import Path
s = json.load(open(__import__("os").environ["OUT"] + "/t67/summary.json"))["summary"]
print("fps", s["throughput_fps"], "dropped", sum(s["dropped"]), "p99", s["latency_ms"]["total"].get("0.99"))
for g in s["gpus"]:
    r = g.get("recording", {})
    print(g.get("worker"), "streams", g["streams"], "segments", r.get("segments"), "failed", r.get("failed"),
          "lost", r.get("lost_gops"), "refused", r.get("refused_gops"), "bytes", r.get("bytes"), "max", r.get("max_bytes"),
          "cpu_s", r.get("cpu_s"), "clips", g.get("clips", {}).get("written"))
for part in sorted(Path("/tmp/rec").iterdir()):
    db = sqlite3.connect(f"file:{part}/index.sqlite3?mode=ro", uri=True)
    print(part.name, "streams", [r[0] for r in db.execute("SELECT DISTINCT stream FROM segments ORDER BY stream")],
          "segments", db.execute("SELECT COUNT(*), SUM(bytes) FROM segments WHERE open = 0").fetchone(),
          "events", db.execute("SELECT COUNT(*) FROM events").fetchone()[0],
          "clips", db.execute("SELECT COUNT(*) FROM media WHERE kind = 'clip'").fetchone()[0])
PY
du -sb /tmp/rec /tmp/rec/* /tmp/clips | tee $R/du.txt
SPAN=$(python -c "
import sqlite3, glob
for index in glob.glob('/tmp/rec/worker*/index.sqlite3'):
    rows = sqlite3.connect(index).execute('SELECT start, end FROM segments WHERE stream = 9 AND open = 0 ORDER BY start').fetchall()
    if len(rows) >= 3: print(rows[0][0] + 1, rows[2][1] - 1)")
echo "export of stream 9 from $SPAN"
python -m jetpipe export recording /tmp/rec --stream 9 --from ${SPAN% *} --to ${SPAN#* } -o /tmp/s9.mp4 && ffprobe -v error -show_entries format=duration -of csv=p=0 /tmp/s9.mp4
python -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/service/test_gpus_gpu.py tests/pipelines/outputs/test_recording_gpu.py tests/pipelines/outputs/test_clips_gpu.py 2>&1 | tail -4
