# issue 66 target 4, for the next lease (not run yet: session 49 had no device time). This tree against aa41c55
# (.dev/old: the tree before session 49's batch JSON and the seen tracks' unground pairs). Make the old tree:
#   mkdir -p .dev/old && git archive aa41c55 jetpipe scripts pyproject.toml | tar -x -C .dev/old
# and send .dev/old along with .dev/kit and .dev/ff. PART=1: the bundle and the GPU tests of the post stage and
# the daemon, each file bounded; PART=2: bench_post.py on the host's cores (both trees, two pairs), then 16 dense
# streams (500 words, ~61 tracked a frame) in the daemon, both trees interleaved, two repeats.
set -u
R=$OUT/t66g; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
nproc | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
if [ "${PART:-1}" = 1 ]; then
  python -c "import PyNvVideoCodec, onnxruntime as o; print('nvdec ok', o.get_available_providers())" 2>&1 | tee -a $R/gpu.txt
  for f in ${TESTS:-tests/pipelines/core tests/pipelines/service/test_daemon_gpu.py}; do
    timeout 240 python -m pytest -q -p no:cacheprovider -m gpu $f >> $R/gpu_tests.txt 2>&1; echo "$f rc=$?" >> $R/gpu_tests.txt
  done
  grep -E "rc=|passed|failed" $R/gpu_tests.txt
fi
if [ "${PART:-1}" = 2 ]; then
  mk 200; mk 500
  for i in 1 2; do for t in . .dev/old; do
    echo -n "post $t: "
    python $t/scripts/bench_post.py /tmp/det --video /tmp/words200.mp4 --frames 300 --rounds 300 --repeats 2 \
      --json $R/post_$(basename $(realpath $t))_$i.json 2>&1 | tail -1 | cut -c1-330
  done; done
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 16 --seconds 20 --repeats 2 \
    --tree new=. --tree old=.dev/old --json $R/dense500.json 2>&1 | tail -4 | cut -c1-600
fi
