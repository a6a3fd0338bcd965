# lease B, this tree = the session 45 tree (84af127 + the post-stage groups), .dev/old = a55ae67
# 32 dense streams (500 words, ~61 tracked), this tree: one process and --workers-per-gpu 2, MPS running
set -u
R=$OUT/t66e; mkdir -p $R
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS on"
python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 32 --seconds 20 --repeats 1 \
  --variant 'workers2=--workers-per-gpu 2' --json $R/dense500_32_mps.json 2>&1 | tail -3 | cut -c1-600
echo quit | nvidia-cuda-mps-control; echo "MPS off"
