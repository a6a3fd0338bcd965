# Session 61: where a serve whose batch the GPU never finishes is held after SIGTERM (py-spy dump of every thread)
set -u
R=$OUT/hung; mkdir -p $R
[ -d /tmp/det ] || python -m jetpipe convert ppocr-det -o /tmp/det --max-batch 8 --quiet >/dev/null 2>&1
python - <<'PY' > $R/script.py
import re
text = open("tests/runtime/test_gpu.py").read()
print(re.search(r'HUNG_SERVE = """(.*?)"""', text, re.S).group(1))
PY
python $R/script.py /tmp/det > $R/out.txt 2> $R/err.txt &
PID=$!
for i in $(seq 120); do grep -q hung $R/out.txt && break; sleep 0.5; done
echo "hung after $i" | tee -a $R/log.txt
kill -TERM $PID; kill -TERM $PID
sleep 12; echo "alive 12 s after: $(kill -0 $PID 2>/dev/null && echo yes || echo no)" | tee -a $R/log.txt
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)  # the kit installs it under /tmp/site (session 61: not on PATH)
$SPY dump --pid $PID --native > $R/dump12.txt 2>&1 || $SPY dump --pid $PID > $R/dump12.txt 2>&1
sleep 10; echo "alive 22 s after: $(kill -0 $PID 2>/dev/null && echo yes || echo no)" | tee -a $R/log.txt
$SPY dump --pid $PID > $R/dump22.txt 2>&1
kill -9 $PID 2>/dev/null; wait $PID; echo "rc $?" | tee -a $R/log.txt
tail -20 $R/err.txt
