# Session 58, one lease.
# PART=T: the GPU tests of session 57's last tree that did not run in their final form (the NVDEC test refactored in
#   c79c451 onto test_sources.read_until_silent), the network NVDEC path's others, and recording (630cf0a: a recording
#   process whose serving process went leaves its open segments to the repair).
# PART=P: issue 66 target 3 (32 live sparse 1080p30 streams, p99 <= 33 ms): are the streams in step? 32 looped
#   --realtime files (the runs behind every earlier target-3 figure) against 32 network cameras timed from their
#   connections (bench_busy's cameras so far) and 32 on clocks of their own (random places in the frame interval, as
#   free-running cameras are), interleaved, two rounds; the CLI's defaults (no rules) and a jsonl sink (bench_busy
#   reads the captures' times from it: arrival_phases). testsrc2 1080p30 (.dev/vid/nob.mp4).
# PART=H: the batcher holding a partial batch while the GPU has two it has not finished (this tree) against the tree
#   before (4560c6f in .dev/old), interleaved, two rounds: 32 cameras on clocks of their own, then 32 looped files;
#   the same flags as PART=P (steady_p99_ms: the records after each stream's first 2 s). (Its files arm found no
#   video: the old tree runs in its folder and the path was relative; bench_busy resolves it now.)
# PART=B: what a network camera's connection gathers before its capture thread reads it, opened as serve opens it
#   (scripts/diag/open_backlog.py): 32 cameras at once through NVDEC (decoder made, first frame decoded), then the
#   same without a decoder (the CPU machine's figure: 0-6 frames each), and the longest GIL stall meanwhile.
# PART=F: the files arm again, in a second lease, and 16 looped files (issue 66 target 5: not worse), one run a tree.
set -u
R=$OUT/t64; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
if [ "${PART:-T}" = T ]; then
  for f in "tests/pipelines/ingest/test_video_gpu.py -k network" tests/pipelines/outputs/test_recording_gpu.py; do
    timeout 280 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -3 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-T}" = P ]; then
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
  for k in ${ROUNDS:-1 2}; do
    for arm in "files" "cameras --network --remux-shim --camera-phases connection,random"; do
      set -- $arm; name=$1_$k; shift
      python scripts/bench_busy.py /tmp/det --video .dev/vid/nob.mp4 --no-rules --streams 32 --seconds 20 \
        --repeats 1 "$@" --json $R/$name.json > $R/$name.txt 2>&1
      python - $R/$name.json $name <<'PY' | tee -a $R/runs.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"],
          "densest_quarter", r["arrival_phases"]["densest_quarter"], "phases", r["arrival_phases"]["ms"],
          "behind", r.get("behind_camera_ms"), "gpu", r["gpu_busy_share"], "cores", r["cpu_cores"],
          "said", r["workers_said"])
PY
    done
  done
fi
ARMS=("cameras 32 --network --remux-shim --camera-phases random" "files 32")
[ "${PART:-T}" = F ] && { PART=H; ROUNDS=1; ARMS=("files 32" "files 16"); }
if [ "${PART:-T}" = H ]; then
  [ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
  for k in ${ROUNDS:-1 2}; do
    for arm in "${ARMS[@]}"; do
      set -- $arm; name=hold_$1$2_$k; streams=$2; shift 2
      python scripts/bench_busy.py /tmp/det --video .dev/vid/nob.mp4 --no-rules --streams $streams --seconds 20 \
        --repeats 1 --tree new=. --tree old=.dev/old "$@" --json $R/$name.json > $R/$name.txt 2>&1
      python - $R/$name.json $name <<'PY' | tee -a $R/runs_h.txt
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], r["run"], r["fps"], "dropped", r["dropped"], "p50", r["p50_ms"], "p99", r["p99_ms"],
          "steady", r["steady_p50_ms"], r["steady_p99_ms"], "a batch", r["frames_a_batch"], "held", r["batches_held"],
          "densest_quarter", r["arrival_phases"]["densest_quarter"], "gpu", r["gpu_busy_share"], "cores", r["cpu_cores"])
PY
    done
  done
fi
if [ "${PART:-T}" = B ]; then
  for arm in "--nvdec" "" "--nvdec"; do
    python scripts/diag/open_backlog.py .dev/vid/nob.mp4 --cameras 32 --remux-shim $arm 2>&1 | tee -a $R/backlog.txt | \
      sed -n 1p
    tail -1 $R/backlog.txt
  done
fi
