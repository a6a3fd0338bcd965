"""python candidates_ab.py OLD NEW PASSES.pkl: pairs.Candidates of both trees (pairs.py imports numpy alone) on every
sweep OLD's botsort makes over the captured passes, checked equal, then timed alternately (20 rounds): CPU
microseconds a pass."""
import importlib.util
import pickle
import statistics
import sys
import time

import numpy as np

old, new, passes = sys.argv[1:4]
sys.path.insert(0, old)
from jetpipe.pipelines.core.tracking import botsort, pairs  # noqa: E402

args = []
made = pairs.Candidates.__init__


def keep(self, *a, **k):
    args.append((a, k))
    made(self, *a, **k)


pairs.Candidates.__init__ = keep
calls = pickle.load(open(passes, "rb"))
table = botsort.BotSortTable()
for frames in calls:
    table.update(frames)
pairs.Candidates.__init__ = made


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


arms = {name: load(f"{tree}/jetpipe/pipelines/core/tracking/pairs.py", f"pairs_{name}")
        for name, tree in (("old", old), ("new", new))}
for a, k in args:
    x, y = arms["old"].Candidates(*a, **k), arms["new"].Candidates(*a, **k)
    assert np.array_equal(x.track, y.track) and np.array_equal(x.det, y.det)
res = {k: [] for k in arms}
for r in range(20):
    for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
        start = time.thread_time()
        for a, k in args:
            arms[name].Candidates(*a, **k)
        res[name].append((time.thread_time() - start) / len(calls) * 1e6)
for name, v in res.items():
    print(name, "us a pass: min", round(min(v)), "median", round(statistics.median(v)))
