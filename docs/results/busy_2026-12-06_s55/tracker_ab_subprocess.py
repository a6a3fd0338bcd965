"""python tracker_ab_subprocess.py OLD NEW PASSES.pkl ROUNDS: tracker_time.py of each tree in its own process (the
trees' tracking packages whole: kalman.py and pairs.py too), alternated ROUNDS times; each process's best of 5 runs;
min and median a tree, and NEW's over OLD's."""
import statistics
import subprocess
import sys
from pathlib import Path

old, new, passes, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
timer = str(Path(__file__).with_name("tracker_time.py"))
res = {old: [], new: []}
for r in range(rounds):
    for tree in ((old, new) if r % 2 == 0 else (new, old)):
        out = subprocess.run([sys.executable, timer, tree, passes, "5"], capture_output=True, text=True).stdout
        res[tree].append(min(int(x) for x in out.split("per pass us")[1].strip(" []\n").split(",")))
for tree, v in res.items():
    print(tree, "min", min(v), "median", statistics.median(v), v)
print("new/old median", round(statistics.median(res[new]) / statistics.median(res[old]), 3),
      "min", round(min(res[new]) / min(res[old]), 3))
