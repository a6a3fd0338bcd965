# lease B, this tree = the session 45 tree (84af127 + the post-stage groups), .dev/old = a55ae67
# issue 66 session 45, after: the GPU tests touched (runtime ready, the daemon), then 16 busy streams new vs old
# (a55ae67) interleaved: the 200-word video (~41-45 tracked) and the 500-word video (~61 tracked), one process.
set -u
R=$OUT/t66d; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
python -c "import PyNvVideoCodec, onnxruntime as o; print('nvdec ok', o.get_available_providers())" 2>&1 | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
if [ "${PART:-1}" = 1 ]; then
  python -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_gpu.py tests/pipelines/service/test_daemon_gpu.py 2>&1 | tail -4
  mk 200
  python scripts/bench_busy.py /tmp/det --video /tmp/words200.mp4 --words 200 --streams 16 --seconds 20 --repeats 2 \
    --tree new=. --tree old=.dev/old --json $R/busy16_200.json 2>&1 | tail -4 | cut -c1-520
fi
if [ "${PART:-1}" = 2 ]; then
  mk 500
  cp scripts/bench_post.py .dev/old/scripts/bench_post.py
  for t in . .dev/old . .dev/old; do echo -n "post $t: "
    python $t/scripts/bench_post.py /tmp/det --video /tmp/words200.mp4 --frames 300 --rounds 300 --repeats 1 2>&1 | tail -1 | cut -c1-330
  done
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 16 --seconds 20 --repeats 2 \
    --tree new=. --tree old=.dev/old --json $R/busy16_500.json 2>&1 | tail -4 | cut -c1-520
fi
