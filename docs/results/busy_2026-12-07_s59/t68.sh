# Session 59, a third lease: is the 32-dense bimodality (t65 PART=D: the first run of each pair with short queues,
# the second with full ones, whichever tree) the run's order or chance? This tree only: four runs back to back
# (bench_busy's --tree a=. --tree b=. --repeats 2: a-1, b-1, a-2, b-2), then a 45-s pause, then one more.
# 32 live streams of the 500-word video (~61 tracked a frame), botsort + 4 rules + jsonl, 20 s a run.
set -u
R=$OUT/t68; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
show() {
  python - $1 $2 <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "steady", r["steady_p50_ms"], r["steady_p99_ms"],
          "tail", r["steady_tail_ms"], "post busy", r["post_thread_busy_share"], "post ms a batch",
          r["post_thread_ms_per_batch"], "cpu", r["cpu_seconds"], "gpu", r["gpu_busy_share"])
PY
}
python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 2 \
  --tree a=. --tree b=. --json $R/order4.json > $R/order4.txt 2>&1
show $R/order4.json order4
sleep 45
python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
  --json $R/after_pause.json > $R/after_pause.txt 2>&1
show $R/after_pause.json after_pause
