# lease A, this tree = a55ae67
set -u
R=$OUT/t66c; mkdir -p $R
python scripts/bench_busy.py /tmp/det --video /tmp/words500.mp4 --words 500 --streams 16 --seconds 20 --repeats 1 \
  --py-spy $R --json $R/dense500_spy.json 2>&1 | tail -3 | cut -c1-300
ls -la $R; gzip -9 $R/*.txt; ls -la $R
