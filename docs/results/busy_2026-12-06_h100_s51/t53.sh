# Session 51, third lease (one H100): NVDEC frames' copies into their slots waited for on the GPU (the frame's
# `ready` event), not by the capture threads. Send .dev/old = f2aa92f (the tree before):
#   mkdir -p .dev/old && git archive f2aa92f jetpipe scripts pyproject.toml | tar -x -C .dev/old
# PART=T: the new GPU test, then the same with the kernel's wait taken out (it must fail), then the NVDEC tests.
# PART=M: 32 live sparse 1080p30 streams (testsrc2), CLI defaults, 20 s, one process: f2aa92f and this tree
#   without MPS, then with MPS (and this tree with --workers-per-gpu 2 under MPS).
set -u
R=$OUT/t53; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
T=tests/pipelines/ingest/test_video_gpu.py
if [ "${PART:-M}" = T ]; then
  python -m pytest -m gpu -q -p no:cacheprovider "$T::test_a_frame_whose_copy_was_queued_is_read_by_the_kernel_only_after_the_copy" 2>&1 | tail -2 | tee -a $R/tests.txt
  rm -rf /tmp/nowait && mkdir /tmp/nowait && cp -r jetpipe tests pyproject.toml /tmp/nowait/
  sed -i 's/                self.streams.compute.wait_for_event(frame.ready)/                pass/' /tmp/nowait/jetpipe/runtime/gpu_sets.py
  grep -c "wait_for_event(frame.ready)" /tmp/nowait/jetpipe/runtime/gpu_sets.py | sed 's/^/waits left in the mutant: /' | tee -a $R/tests.txt
  (cd /tmp/nowait && PYTHONPATH=/tmp/nowait:$PYTHONPATH python -m pytest -m gpu -q -p no:cacheprovider "$T::test_a_frame_whose_copy_was_queued_is_read_by_the_kernel_only_after_the_copy" 2>&1 | tail -2 | sed 's/^/without the wait: /' | tee -a $R/tests.txt)
  timeout 300 python -m pytest -m gpu -q -p no:cacheprovider $T -k "nvdec" 2>&1 | tail -2 | tee -a $R/tests.txt
  for f in tests/pipelines/outputs/test_recording_gpu.py tests/pipelines/outputs/test_clips_gpu.py tests/pipelines/service/test_daemon_gpu.py; do
    timeout 200 python -m pytest -m gpu -q -p no:cacheprovider $f 2>&1 | tail -1 | tee -a $R/tests.txt
  done
fi
if [ "${PART:-M}" = M ]; then
  V=/tmp/v40.mp4
  [ -f $V ] || ffmpeg -loglevel error -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 40 -c:v libx264 -preset veryfast \
    -g 30 -pix_fmt yuv420p $V
  sparse() {  # $1 label, $2 tree, rest: flags
    local label=$1 tree=$2; shift 2
    (cd $tree && python -m jetpipe serve --bundle /tmp/det $(for i in $(seq 32); do echo --source $V; done) --loop \
      --realtime --duration 20 --metrics "" --summary $R/$label.json "$@" >/dev/null 2>$R/$label.err)
    python - $R/$label.json $label <<'PY' | tee -a $R/sparse.txt
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; t = s["latency_ms"]["total"]; c = s.get("cpu_seconds", {})
print(sys.argv[2], s["throughput_fps"], "captured", sum(s["captured"]), "dropped", sum(s["dropped"]), "p50", t["0.5"],
      "p99", t["0.99"], "cores", s["cpu_cores"], "sources_s", c.get("sources"), "gpu_busy", s.get("gpu_busy_share"))
PY
  }
  NEW=$PWD; OLD=$PWD/.dev/old
  sparse old_nomps $OLD; sparse new_nomps $NEW
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && echo "MPS on" | tee -a $R/sparse.txt
  sparse old_mps $OLD; sparse new_mps $NEW; sparse new_mps_w2 $NEW --workers-per-gpu 2
  echo quit | nvidia-cuda-mps-control; echo "MPS off" | tee -a $R/sparse.txt
fi
