"""python capture_calls.py BUNDLE COMPONENTS.npz OUT.pkl [BATCH]: botsort's input of every pass of bench_post.py's
replay (16 streams, 200 rounds, batches of BATCH, default 8) of a video's cached model outputs (bench_post.py writes
VIDEO.det.300.components.npz beside the video), pickled for tracker_time.py and candidates_ab.py. Session 55's
PASSES.pkl: words500's, batches of 8 (400 passes, ~480 detections each)."""
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[3] / "scripts"), str(Path(__file__).resolve().parents[3])]
import bench_post  # noqa: E402

from jetpipe.pipelines.core.tracking.botsort import BotSortTable  # noqa: E402

bundle, components, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
calls, update = [], BotSortTable.update


def keep(self, frames, embed=None):
    calls.append([(f[0], np.array(f[1]), np.array(f[2]), f[3], *f[4:]) for f in frames])
    return update(self, frames, embed)


class Args:
    streams, rounds, batch = 16, 200, int(sys.argv[4]) if len(sys.argv) > 4 else 8


BotSortTable.update = keep
with tempfile.TemporaryDirectory() as folder:
    bench_post.replay(bundle, dict(np.load(components)), Args, Path(folder) / "out.jsonl")
out.write_bytes(pickle.dumps(calls))
print(len(calls), "passes")
