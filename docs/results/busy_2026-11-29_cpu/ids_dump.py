"""The tracker alone on bench_post's replay: every frame's track IDs saved (to compare two trees) and its thread
CPU per tracked object, best of three passes. Run with the tree under test first on sys.path (ab.sh does).

    python ids_dump.py CACHE.components.npz OUT.npy [ROUNDS]
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = ["/work/main/scripts", "/work/main"]
import bench_post  # noqa: E402

from jetpipe.pipelines.core.steps import TrackStep  # noqa: E402
from jetpipe.tasks.detections import finish_detections  # noqa: E402

arrays = dict(np.load(sys.argv[1]))
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 300
post = bench_post.postprocessor_of(Path("/tmp/det"))
batches = [(packets, finish_detections(post, outputs, boxes, sizes, reduced=True))
           for packets, outputs, boxes, sizes in bench_post.batches(arrays, 16, rounds, 8)]
best = None
for _ in range(3):
    step = TrackStep("botsort", 16)
    ids = []
    started = time.thread_time()
    for packets, results in batches:
        step.run(packets, results)
        ids += [found.tracker_id.copy() for found in results]
    spent = time.thread_time() - started
    best = spent if best is None else min(best, spent)
tracked = sum(int((i >= 0).sum()) for i in ids)
print(f"tracker {1e6 * best / tracked:.2f} us per tracked object (best of 3), tracked {tracked}")
np.save(sys.argv[2], np.concatenate(ids))
