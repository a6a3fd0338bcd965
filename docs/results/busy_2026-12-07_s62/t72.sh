# Session 62: session 61's t71.sh, PART now a list of parts (PART="T O" runs both, in that order of the file).
# Model instances measured where sessions 60 and 61's leases could not. Each arm pair within the lease, interleaved; the serve runs are bounded (bench_busy --serve-timeout).
# PART=T: the GPU tests of instances (the shared post stream's stress test, auto's choice, the pipeline's records).
# PART=C: target 3: 32 network cameras on clocks of their own (testsrc2 1080p30), CLI defaults + jsonl, one
#   instance against auto (two: 960 frames/s offered against ~1,037), two pairs.
# PART=O: target 2: 48 and 96 overloaded live streams of the 72-word video, 66 ms budget, one against auto;
#   target 5: 16 live sparse files, one against two (auto keeps one there: the cost of a second at light load).
# PART=O48: 48 overloaded streams only, one against auto (ARMS="auto one" swaps the order, PAIR=b names the
#   second pair): what session 62 ran, inline, in its two last calls (over48/).
# PART=D: 32 dense streams (500 words, botsort + 4 rules + jsonl), one against auto: the CPU-bound case.
set -u
has() { [[ " ${PART:-T} " == *" $1 "* ]]; }
R=$OUT/t72; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
grep -m1 "model name" /proc/cpuinfo | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
V=.dev/vid/nob.mp4
show() {
  python - $1 $2 <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "catching up", r.get("dropped_catching_up"),
          "p50", r["p50_ms"], "p99", r["p99_ms"], "steady", r["steady_p50_ms"], r["steady_p99_ms"], "tail",
          r["steady_tail_ms"], "a batch", r["frames_a_batch"], "gpu", r["gpu_busy_share"], "post busy",
          r["post_thread_busy_share"], "us/object", r["serving_us_per_object"], "said", r.get("instances_said"))
PY
}
run() { # $1 label, $2.. serve flags
  local label=$1; shift 1
  timeout 200 python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" --summary $R/$label.json \
    >/dev/null 2>$R/$label.err || echo "$label: exit $?" | tee -a $R/runs.txt
  python - $R/$label.json $label $R/$label.err <<'PY' | tee -a $R/runs.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
said = [l.split("model_instances auto: ", 1)[1][:100] for l in open(sys.argv[3]) if "model_instances auto: " in l]
print(sys.argv[2], s["throughput_fps"], "dropped", sum(s["dropped"]), "p50", t["0.5"], "p99", t["0.99"],
      "per stream", min(s["processed"]), max(s["processed"]), "gpu", s.get("gpu_busy_share"), "said", said)
PY
}
S() { for i in $(seq $1); do echo --source $2; done; echo --loop --realtime; }
if has T; then
  timeout 400 python -m pytest -m gpu -q -p no:cacheprovider tests/runtime/test_gpu.py \
    tests/runtime/test_postprocess_gpu.py tests/pipelines/ingest/test_video_gpu.py -k "instances or never_finishes" \
    2>&1 | tail -5 | tee -a $R/tests.txt
fi
if has C; then
  python scripts/bench_busy.py /tmp/det --video $V --no-rules --streams 32 --seconds 20 --repeats ${REPEATS:-2} --network \
    --remux-shim --camera-phases random --variant 'auto=--model-instances auto' --serve-timeout 120 \
    --json $R/cameras32.json > $R/cameras32.txt 2>&1
  show $R/cameras32.json cameras32
fi
if has O; then
  cp -n .dev/vid/words72.mp4 /tmp/
  for n in 48 96; do
    run over${n}_one $(S $n /tmp/words72.mp4) --latency-budget-ms 66
    run over${n}_auto $(S $n /tmp/words72.mp4) --latency-budget-ms 66 --model-instances auto
  done
  run sparse16_one $(S 16 $V)
  run sparse16_two $(S 16 $V) --model-instances 2
fi
if has S; then  # target 5 alone: 16 live sparse files, one instance against two
  run sparse16_one $(S 16 $V)
  run sparse16_two $(S 16 $V) --model-instances 2
fi
if has O48; then  # what session 62's lease had time for: 48 overloaded streams, one against auto; ARMS sets the order
  cp -n .dev/vid/words72.mp4 /tmp/
  for a in ${ARMS:-one auto}; do
    run over48_${a}${PAIR:-} $(S 48 /tmp/words72.mp4) --latency-budget-ms 66 $([ $a = auto ] && echo --model-instances auto)
  done
fi
if has D; then
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 \
    --repeats 1 --variant 'auto=--model-instances auto' --serve-timeout 120 --json $R/dense32.json \
    > $R/dense32.txt 2>&1
  show $R/dense32.json dense32
fi
# at most 8 files come back from $OUT: the part's files as one archive
P=${PART:-T}; (cd $OUT && tar czf t72_${P// /_}.tgz t72 && rm -rf t72)
