# lease A. issue 66 target 4 on the GPU machine (session 45), this tree = a55ae67, .dev/old = 4fea818. PART=1: bench_post both trees (host cores), then bench_busy
# 16 busy streams (200 words) new vs old interleaved. PART=2: the dense scene (500 words) for target 1, both trees.
set -u
R=$OUT/t66; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
nproc | tee -a $R/gpu.txt
python -c "import PyNvVideoCodec, onnxruntime as o; print('nvdec ok', o.get_available_providers())" 2>&1 | tee -a $R/gpu.txt
mk() { [ -f /tmp/words$1.mp4 ] || python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words$1.mp4'), 20.0, $1)"; }
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null
mk 200
if [ "${PART:-1}" = 1 ]; then
  cp scripts/bench_post.py .dev/old/scripts/bench_post.py
  for i in 1 2; do for t in . .dev/old; do
    echo -n "post $t: "
    python $t/scripts/bench_post.py /tmp/det --video /tmp/words200.mp4 --frames 300 --rounds 300 --repeats 1 \
      --json $R/post_$(basename $(realpath $t))_$i.json 2>&1 | tail -1 | cut -c1-400
  done; done
  python scripts/bench_busy.py /tmp/det --video /tmp/words200.mp4 --words 200 --streams 16 --seconds 20 --repeats 2 \
    --tree new=. --tree old=.dev/old --json $R/busy16.json 2>&1 | tail -8
fi
if [ "${PART:-1}" = 2 ]; then
  mk 500
  python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 16 --seconds 20 --repeats 1 \
    --tree new=. --tree old=.dev/old --json $R/dense500.json 2>&1 | tail -6
fi
