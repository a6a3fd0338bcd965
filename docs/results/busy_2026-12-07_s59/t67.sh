# Session 59, a second lease: a camera's backlog coming at once is told from an overload (the batcher's
# catching_up: a full queue whose frames came at more than twice real time by their own pts).
# PART=C: 32 network cameras on clocks of their own (testsrc2, the CLI's defaults, no rules), then 16 network
#   cameras of the 72-word video with 4 rules (the tracker on), this tree, one run each: every start drop should be
#   counted in dropped_catching_up, the run not `overloaded`, no overload warning.
set -u
R=$OUT/t67; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
show() {
  python - $1 $2 <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "catching up", r["dropped_catching_up"],
          "missing_at_start", r["missing_at_start"], "overloaded", r["overloaded"], "said", r["overload_said"],
          "steady", r["steady_p50_ms"], r["steady_p99_ms"], "tail", r["steady_tail_ms"], "gpu", r["gpu_busy_share"])
PY
}
if [ "${PART:-C}" = C ]; then
  python scripts/bench_busy.py /tmp/det --video .dev/vid/nob.mp4 --no-rules --streams 32 --seconds 20 --repeats 1 \
    --network --remux-shim --camera-phases random --json $R/cameras32.json > $R/cameras32.txt 2>&1
  show $R/cameras32.json cameras32
  python scripts/bench_busy.py /tmp/det --video .dev/vid/words72.mp4 --words 72 --streams 16 --seconds 20 \
    --repeats 1 --network --remux-shim --json $R/cameras16_rules.json > $R/cameras16_rules.txt 2>&1
  show $R/cameras16_rules.json cameras16_rules
fi
