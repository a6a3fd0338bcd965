# Session 59, one lease.
# PART=B: where a network camera's NVDEC open goes (scripts/diag/open_backlog.py --nvdec: each camera's feed started
#   and demuxed, CreateDecoder, the first frame decoded), 32 cameras at once; then with each camera's decoder made
#   before its feed starts (--decoder-first), the fix session 58 named for the cameras' start drops.
# PART=S: issue 66 target 3's tail by stage (bench_busy's steady_tail_ms: queue / gpu / post of the slowest 1 % of
#   the frames after each stream's first 2 s): 32 network cameras on clocks of their own, then 32 looped files; the
#   CLI's defaults (no rules) and a jsonl sink; testsrc2 1080p30 (.dev/vid/nob.mp4); this tree, one run each.
# PART=D: the batcher's hold (ee6bbd9) on dense scenes, never measured there: 16 and 32 live streams of a 500-word
#   video (~61 tracked a frame), botsort + 4 rules + jsonl, this tree against 4560c6f (.dev/old, before the hold),
#   one run a tree, interleaved.
set -u
R=$OUT/t65; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
if [ "${PART:-B}" = B ]; then
  for arm in "--nvdec" "--nvdec --decoder-first"; do
    python scripts/diag/open_backlog.py .dev/vid/nob.mp4 --cameras 32 --remux-shim $arm 2>&1 | tee -a $R/backlog.txt | \
      sed -n 1p
    tail -1 $R/backlog.txt
  done
fi
[ -d /tmp/det ] || [ "${PART:-B}" = B ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet \
  >/dev/null 2>&1
show() {
  python - $1 $2 <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"],
          "steady", r["steady_p50_ms"], r["steady_p99_ms"], "tail", r["steady_tail_ms"], "a batch",
          r["frames_a_batch"], "held", r["batches_held"], "tracked", r["tracked_per_frame"], "gpu",
          r["gpu_busy_share"], "post busy", r["post_thread_busy_share"], "cores", r["cpu_cores"],
          "us/object", r["serving_us_per_object"])
PY
}
if [ "${PART:-B}" = S ]; then
  for arm in "cameras --network --remux-shim --camera-phases random" "files"; do
    set -- $arm; name=tail_$1; shift
    python scripts/bench_busy.py /tmp/det --video .dev/vid/nob.mp4 --no-rules --streams 32 --seconds 20 \
      --repeats 1 "$@" --json $R/$name.json > $R/$name.txt 2>&1
    show $R/$name.json $name
  done
fi
if [ "${PART:-B}" = D ]; then
  for streams in 16 32; do
    name=dense$streams
    python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams $streams --seconds 20 \
      --repeats 1 --tree new=. --tree old=.dev/old --json $R/$name.json > $R/$name.txt 2>&1
    show $R/$name.json $name
  done
fi
