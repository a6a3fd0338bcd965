set -u
mkdir -p $OUT/h
pip install -q --no-deps --target /tmp/site .dev/extra/py_spy-*.whl >/dev/null 2>&1; export PATH=/tmp/site/bin:$PATH
( timeout 200 python scripts/bench_busy.py /tmp/det --video .dev/vid/nob.mp4 --no-rules --streams 32 --seconds 10 --repeats 1 --network --remux-shim --camera-phases random --no-plain --variant 'two=--model-instances 2' --json $OUT/h/b.json > $OUT/h/b.txt 2>&1; echo "bench rc $?" >> $OUT/h/b.txt ) &
B=$!
for t in $(seq 1 19); do sleep 10; kill -0 $B 2>/dev/null || break; done
P=$(pgrep -f "jetpipe serve" | head -1)
if [ -n "$P" ]; then echo "serve still running pid $P at $t"; py-spy dump --pid $P > $OUT/h/dump.txt 2>&1; fi
wait $B
tail -3 $OUT/h/b.txt | cut -c1-600
