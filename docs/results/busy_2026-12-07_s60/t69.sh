# Session 60, H100 leases: model instances (--model-instances 2: two copies of the model, each running its own
# batches on a stream of its own, one process) against one instance, the same tree, interleaved.
# PART=T: the GPU tests of the change; the GPU memory a second instance takes.
# PART=C: issue 66 target 3: 32 network cameras on clocks of their own (testsrc2 1080p30), the CLI's defaults and a
#   jsonl sink, one / two instances, two pairs; then 32 looped files in step, one pair (bench_busy.py).
# PART=O: target 2: 48 and 96 overloaded live streams of the 72-word video, 66 ms budget, one / two instances;
#   target 5: 16 live sparse files, one / two.
set -u
R=$OUT/t69; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
grep -m1 "model name" /proc/cpuinfo | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
show() {
  python - $1 $2 <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"],
          "steady", r["steady_p50_ms"], r["steady_p99_ms"], "tail", r["steady_tail_ms"], "a batch",
          r["frames_a_batch"], "held", r["batches_held"], "gpu", r["gpu_busy_share"], "post busy",
          r["post_thread_busy_share"], "cores", r["cpu_cores"])
PY
}
run() { # $1 label, $2.. serve flags
  local label=$1; shift 1
  python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" --summary $R/$label.json \
    >/dev/null 2>$R/$label.err
  python - $R/$label.json $label <<'PY' | tee -a $R/runs.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]; d = s["dropped"]
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(d), "p50", t["0.5"],
      "p99", t["0.99"], "stream fps spread", min(s["processed"]), max(s["processed"]), "gpu", s.get("gpu_busy_share"))
PY
}
S() { for i in $(seq $1); do echo --source $2; done; echo --loop --realtime; }
V=.dev/vid/nob.mp4
if [ "${PART:-T}" = T ]; then
  timeout 400 python -m pytest -m gpu -q -p no:cacheprovider tests/runtime/test_gpu.py \
    "tests/pipelines/ingest/test_video_gpu.py" -k "instances or decode_processes_give or graphs or async or running" \
    2>&1 | tail -5 | tee -a $R/tests.txt
  python - <<'PY' | tee -a $R/memory.txt
from jetpipe.runtime.gpu_runtime import GpuRuntime
from jetpipe.runtime.cuda import CudaDevice
for n in (1, 2):
    rt = GpuRuntime("/tmp/det", max_batch=8, buffer_sets=4, instances=n)
    print("instances", n, "free MB", round(rt.gpu_free_memory() / 2**20))
    rt.close()
PY
fi
if [ "${PART:-T}" = T2 ]; then  # after the shared post stream: the instance tests, the reduction's stress test
  timeout 300 python -m pytest -m gpu -q -p no:cacheprovider tests/runtime/test_gpu.py \
    tests/runtime/test_postprocess_gpu.py tests/pipelines/ingest/test_video_gpu.py -k "instances" \
    2>&1 | tail -5 | tee -a $R/tests2.txt
fi
if [ "${PART:-T}" = F ]; then  # 32 looped files in step (testsrc2), two instances first this time, then one
  run files32_two $(S 32 $V) --model-instances 2
  run files32_one $(S 32 $V)
fi
if [ "${PART:-T}" = C ]; then
  python scripts/bench_busy.py /tmp/det --video $V --no-rules --streams 32 --seconds 20 --repeats 2 --network \
    --remux-shim --camera-phases random --variant 'two=--model-instances 2' --json $R/cameras32.json \
    > $R/cameras32.txt 2>&1
  show $R/cameras32.json cameras32
  python scripts/bench_busy.py /tmp/det --video $V --no-rules --streams 32 --seconds 20 --repeats 1 \
    --variant 'two=--model-instances 2' --json $R/files32.json > $R/files32.txt 2>&1
  show $R/files32.json files32
fi
if [ "${PART:-T}" = O ]; then
  cp -n .dev/vid/words72.mp4 /tmp/
  for n in 48 96; do
    run over${n}_one $(S $n /tmp/words72.mp4) --latency-budget-ms 66
    run over${n}_two $(S $n /tmp/words72.mp4) --latency-budget-ms 66 --model-instances 2
  done
  run sparse16_one $(S 16 $V)
  run sparse16_two $(S 16 $V) --model-instances 2
fi
