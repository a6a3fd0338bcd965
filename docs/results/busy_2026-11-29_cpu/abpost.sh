#!/bin/bash
# bench_post on the old tree and this one, interleaved
N=${N:-2}
cp /work/main/scripts/bench_post.py /tmp/t66/old/scripts/bench_post.py
for i in $(seq $N); do
  for tree in /tmp/t66/old /work/main; do
    echo -n "$(basename $tree): "
    (cd /tmp && /work/main/.venv/bin/python $tree/scripts/bench_post.py /tmp/det --words 200 --frames 300 --rounds ${ROUNDS:-300} --repeats 1 2>&1 | tail -1 | python3 -c "
import json,sys; d=json.loads(sys.stdin.read()); print(d['us_per_object'], 'serving', d['serving_us_per_object'])")
  done
done
