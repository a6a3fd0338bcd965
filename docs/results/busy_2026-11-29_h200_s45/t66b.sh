# lease A, this tree = a55ae67
# issue 66 target 1 on the dense scene (500 words, ~61 tracked): one process vs --workers-per-gpu 2, MPS running
set -u
R=$OUT/t66b; mkdir -p $R
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS on"
python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 16 --seconds 20 --repeats 2 \
  --variant 'workers2=--workers-per-gpu 2' --json $R/dense500_mps.json 2>&1 | tail -6 | cut -c1-420
echo quit | nvidia-cuda-mps-control; echo "MPS off"
