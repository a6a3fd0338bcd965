# issue 65 item 2 on the GPU runtime: two NVDEC streams of the panning words video with moving_camera = true;
# then the daemon's GPU tests.
set -u
R=$OUT/cam; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet
python -c "
import sys; sys.path[:0] = ['scripts', '.']
from pathlib import Path; from bench_events import make_video; make_video(Path('/tmp/words72.mp4'), 6.0, 72)"
cat > /tmp/cam.toml <<TOML
[pipeline]
bundle = "/tmp/det"
tracker = "botsort"
duration = 5
[[source]]
uri = "/tmp/words72.mp4"
decoder = "nvdec"
moving_camera = true
[[source]]
uri = "/tmp/words72.mp4"
decoder = "nvdec"
TOML
python -m jetpipe serve /tmp/cam.toml --metrics "" --summary $R/cam.json 2>$R/cam.err >/dev/null; echo rc=$?
python -c "import json; s=json.load(open('$R/cam.json'))['summary']; print(s.get('moving_cameras'), s['processed'], s['backend'])"
grep -i "moving_camera\|error\|Traceback" $R/cam.err | head -5
python -m pytest -m gpu -q -p no:cacheprovider tests/pipelines/service/test_daemon_gpu.py 2>&1 | tail -2
