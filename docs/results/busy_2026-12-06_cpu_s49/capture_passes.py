"""python capture_passes.py TREE VIDEO OUT.pkl: the tracker's input of every pass of bench_post.py's replay
(16 streams, 300 rounds, batches of 8) on TREE's code, pickled for tracker_ab.py."""
import argparse
import pickle
import sys
import tempfile
from pathlib import Path

tree, video, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
sys.path[:0] = [f"{tree}/scripts", tree]
import bench_post  # noqa: E402

from jetpipe.pipelines.core.tracking import botsort  # noqa: E402

captured = []
update = botsort.BotSortTable.update


def keep(self, frames, embed=None):
    captured.append([(s, b.copy(), c.copy(), t, *rest) for s, b, c, t, *rest in frames])
    return update(self, frames, embed)


botsort.BotSortTable.update = keep
args = argparse.Namespace(streams=16, rounds=300, batch=8)
arrays = bench_post.model_outputs(Path("/tmp/det"), video, 300, video.with_name(f"{video.stem}.det.300.components.npz"))
bench_post.replay(Path("/tmp/det"), arrays, args, Path(tempfile.mktemp()))
out.write_bytes(pickle.dumps(captured))
print(len(captured), "passes,", sum(len(b) for f in captured for _, b, *_ in f), "detections")
