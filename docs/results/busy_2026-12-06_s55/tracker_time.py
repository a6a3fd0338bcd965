"""python tracker_time.py TREE PASSES.pkl [RUNS] [save IDS.pkl | check IDS.pkl]: TREE's botsort table over the captured
passes (capture_passes.py), RUNS times in one process: CPU microseconds a pass each run; save / check every frame's
IDs (a change that claims to keep them: the same to the element)."""
import pickle
import sys
import time

import numpy as np

tree, passes = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
from jetpipe.pipelines.core.tracking import botsort  # noqa: E402

calls = pickle.load(open(passes, "rb"))


def once():
    table, out = botsort.BotSortTable(), []
    start = time.thread_time()
    for frames in calls:
        out.append(table.update(frames))
    return time.thread_time() - start, [ids for batch in out for ids in batch]


times = []
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
    spent, ids = once()
    times.append(spent)
print(tree, "per pass us", [round(t / len(calls) * 1e6) for t in times])
if len(sys.argv) > 5:
    if sys.argv[4] == "save":
        pickle.dump(ids, open(sys.argv[5], "wb"))
    else:
        base = pickle.load(open(sys.argv[5], "rb"))
        print("identical IDs:", len(base) == len(ids) and all(np.array_equal(a, b) for a, b in zip(base, ids)))
