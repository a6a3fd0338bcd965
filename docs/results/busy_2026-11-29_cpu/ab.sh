#!/bin/bash
# A/B of the tracker alone on the replay: old tree (/tmp/t66/old) against this one, interleaved, N rounds
N=${N:-4}
for i in $(seq $N); do
  for tree in /tmp/t66/old /work/main; do
    sed "s#/work/main/scripts\", \"/work/main#$tree/scripts\", \"$tree#" $(dirname "$0")/ids_dump.py > /tmp/t66/ids_$$.py
    cp /work/main/scripts/bench_post.py $tree/scripts/bench_post.py 2>/dev/null
    echo -n "$(basename $tree): "; /work/main/.venv/bin/python /tmp/t66/ids_$$.py /tmp/jetpipe-words200.det.300.components.npz /tmp/t66/ids_$(basename $tree).npy
  done
done
python3 -c "
import numpy as np; a=np.load('/tmp/t66/ids_old.npy'); b=np.load('/tmp/t66/ids_main.npy'); print('same IDs', a.shape == b.shape and (a==b).all())"
