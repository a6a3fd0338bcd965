# issue 66 target 1's scene: 400 words a frame, 16 live streams, one process vs 2 workers, MPS on (one H200)
set -u
R=$OUT/w400; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu.txt
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS on"
python scripts/bench_busy.py /tmp/det --words 400 --streams 16 --seconds 20 --repeats 1 \
  --variant 'workers2=--workers-per-gpu 2' --json $R/busy400_16_mps.json 2>&1 | python .dev/rows.py
echo quit | nvidia-cuda-mps-control
