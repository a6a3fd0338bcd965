# Session 55, one lease (t58.sh of session 54, run now: its parts T, S, N, M had no lease then).
# PART=T: the GPU tests of what session 53's last commits changed without a GPU (0612f0a, a30942b: the remux feed on
#   started_with_copy, the kept read end and its watcher, the shared demux loop): recording, clips, network video.
# PART=S: 32 live sparse streams (testsrc2), two rounds of three arms: CUDA MPS running, auto (the default: two
#   workers) and --workers-per-gpu 1; MPS stopped, the defaults (auto: one process) (issue 66 target 3: p99 <= 33 ms;
#   session 53's H100 gave one process without MPS p99 36.8 ms, against 40.6-51.6 for two workers under it).
# PART=M: one serving process with and without CUDA MPS running, interleaved (session 53 saw one process under MPS
#   slower than one without it on other H100s: 876-926 against 960-988 frames/s): 48 overloaded live streams of the
#   72-word video, 66 ms budget, --workers-per-gpu 1, two pairs; then 16 sparse live streams (what auto runs in
#   one process where MPS runs), one pair.
# PART=F: only the two new fallback tests (they need PyCUDA, PyNvVideoCodec, ffmpeg and PyAV: kits nvdec, ff, av),
#   on this tree, then PART=O.
# PART=O: the two new fallback tests on the tree before (a30942b in .dev/old, this tree's tests): they should fail.
# PART=D: the defaults (auto) with CUDA MPS running (two workers) against them with MPS stopped (one process), one pair
#   each: 96 overloaded live streams of the 72-word video (66 ms budget), 32 dense live streams (500 words, bench_busy.py:
#   botsort, 4 rules, jsonl): whether auto's two workers under MPS pay on this machine (PART=S: not for 32 sparse).
# PART=P: network cameras demuxed by PyAV (nvdec_pipe.py), not PyNvVideoCodec's callback demuxer: the GPU tests of
#   the network NVDEC path, then 16 network cameras of the 72-word video, this tree against the one before (.dev/old),
#   interleaved (REPEATS a tree).
# PART=N: session 53's open question (16 frame-paced network cameras dropped 7 %, post thread 74-81 % busy): the same
#   16 streams of the 72-word video as network cameras and as looped --realtime files, 20 s each, the serving
#   process's GIL holders sampled by py-spy (bench_busy.py --py-spy) in both.
set -u
R=$OUT/t59; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
case "${PART:-T}" in S|M|N|D|P)
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1;; esac
V=/tmp/v40.mp4
case "${PART:-T}" in S|M) [ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
  -g 30 -pix_fmt yuv420p $V;; esac
run() { # $1 label, $2.. serve flags
  local label=$1; shift 1
  python -m jetpipe serve --bundle /tmp/det "$@" --duration 20 --metrics "" --summary $R/$label.json \
    >/dev/null 2>$R/$label.err
  python - $R/$label.json $label $R/$label.err <<'PY' | tee -a $R/runs.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]
said = [l.split("workers_per_gpu auto: ", 1)[1][:90] for l in open(sys.argv[3]) if "workers_per_gpu auto: " in l]
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(s["dropped"]), "p50", t["0.5"],
      "p99", t["0.99"], "processes", len(s.get("gpus", [])) or 1, "said", said)
PY
}
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/runs.txt
}
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; echo "MPS off" | tee -a $R/runs.txt; }
S() { for i in $(seq $1); do echo --source $2; done; echo --loop --realtime; }
if [ "${PART:-T}" = T ]; then
  for f in tests/pipelines/outputs/test_recording_gpu.py "tests/pipelines/ingest/test_video_gpu.py -k network" \
      tests/pipelines/outputs/test_clips_gpu.py; do
    timeout 280 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -4 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-T}" = S ]; then
  for k in 1 2; do
    mps_on; run sparse32_auto_$k $(S 32 $V); run sparse32_one_$k $(S 32 $V) --workers-per-gpu 1; mps_off
    run sparse32_nomps_$k $(S 32 $V)
  done
fi
if [ "${PART:-T}" = N ]; then
  for w in 72; do [ -f /tmp/words$w.mp4 ] || cp .dev/vid/words$w.mp4 /tmp/; done
  for mode in network files; do
    net=""; [ $mode = network ] && net="--network --remux-shim"
    python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 --repeats 1 \
      $net --py-spy $R/spy_$mode --json $R/$mode.json > $R/$mode.txt 2>&1
    python - $R/$mode.json $mode <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"], "tracked",
          r["tracked_per_frame"], "us/object", r["serving_us_per_object"], "post busy", r["post_thread_busy_share"],
          "gpu", r["gpu_busy_share"], "cpu", r["cpu_seconds"])
PY
  done
fi
if [ "${PART:-T}" = F ]; then
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/pipelines/outputs/test_recording_gpu.py -k cannot_take \
    2>&1 | grep -E "passed|failed|skipped|Error|assert" | tail -8 | tee -a $R/tests.txt
  PART=O
fi
if [ "${PART:-T}" = O ]; then
  rm -rf /tmp/oldtree && cp -r .dev/old /tmp/oldtree && cp -r tests /tmp/oldtree/ && cd /tmp/oldtree
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/pipelines/outputs/test_recording_gpu.py -k cannot_take \
    2>&1 | grep -E "passed|failed|Error|assert" | tail -8 | tee -a $R/tests_old.txt
  cd - >/dev/null
fi
if [ "${PART:-T}" = M ]; then
  for w in 72; do [ -f /tmp/words$w.mp4 ] || cp .dev/vid/words$w.mp4 /tmp/; done
  for k in 1 2; do
    mps_on; run over48_mps_$k $(S 48 /tmp/words72.mp4) --latency-budget-ms 66 --workers-per-gpu 1; mps_off
    run over48_nomps_$k $(S 48 /tmp/words72.mp4) --latency-budget-ms 66 --workers-per-gpu 1
  done
  mps_on; run sparse16_mps $(S 16 $V); mps_off
  run sparse16_nomps $(S 16 $V)
fi
if [ "${PART:-T}" = D ]; then
  for w in 72 500; do [ -f /tmp/words$w.mp4 ] || cp .dev/vid/words$w.mp4 /tmp/; done
  mps_on; run over96_auto_mps $(S 96 /tmp/words72.mp4) --latency-budget-ms 66; mps_off
  run over96_auto_nomps $(S 96 /tmp/words72.mp4) --latency-budget-ms 66
  for arm in mps nomps; do
    [ $arm = mps ] && mps_on
    python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
      --json $R/dense32_$arm.json > $R/dense32_$arm.txt 2>&1
    [ $arm = mps ] && mps_off
    python - $R/dense32_$arm.json dense32_$arm <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"], "tracked",
          r["tracked_per_frame"], "us/object", r["serving_us_per_object"], "post busy", r["post_thread_busy_share"],
          "gpu", r["gpu_busy_share"], "cpu", r["cpu_seconds"])
PY
  done
fi
if [ "${PART:-T}" = P ]; then
  for f in "tests/pipelines/ingest/test_video_gpu.py -k network" "tests/pipelines/outputs/test_recording_gpu.py" \
      tests/pipelines/outputs/test_clips_gpu.py; do
    timeout 200 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -3 | tee -a $R/tests.txt
  done
  [ -f /tmp/words72.mp4 ] || cp .dev/vid/words72.mp4 /tmp/
  python scripts/bench_busy.py /tmp/det --video /tmp/words72.mp4 --words 72 --streams 16 --seconds 20 \
    --repeats ${REPEATS:-1} --network --remux-shim --tree new=. --tree old=.dev/old --json $R/pipe.json > $R/pipe.txt 2>&1
  python - $R/pipe.json <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print("network", r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"], "tracked",
          r["tracked_per_frame"], "us/object", r["serving_us_per_object"], "post busy", r["post_thread_busy_share"],
          "gpu", r["gpu_busy_share"], "cpu", r["cpu_seconds"])
PY
fi
