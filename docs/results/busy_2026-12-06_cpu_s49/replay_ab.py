"""python replay_ab.py TREE [ROUNDS] [BATCH]: bench_post.py's replay on TREE's code (its own script), four times;
each phase's CPU per tracked object (the median of the last three), and a digest of every record and event with
their wall-clock fields left out (the events' order too: their decisions wait on a wall-clock limit). Two trees
that give the same results give the same digest. Needs /tmp/det and /tmp/jetpipe-words200.mp4 (bench_post.py
makes the video)."""
import argparse
import hashlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

tree = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 8
sys.path[:0] = [f"{tree}/scripts", tree]
import bench_post  # noqa: E402

args = argparse.Namespace(streams=16, rounds=rounds, batch=batch)
video = Path("/tmp/jetpipe-words200.mp4")
arrays = bench_post.model_outputs(Path("/tmp/det"), video, 300, video.with_name(f"{video.stem}.det.300.components.npz"))
rows = []
for repeat in range(4):
    out = Path(tempfile.mktemp())
    rows.append(bench_post.replay(Path("/tmp/det"), arrays, args, out))
    if repeat == 0:
        lines = []
        for line in out.read_text().splitlines():
            record = json.loads(line)
            for key in ("t_result", "latency_ms", "event_id"):
                record.pop(key, None)
            lines.append(json.dumps(record, sort_keys=True))
        digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12]
    out.unlink()
per = {k: statistics.median(r["us_per_object"][k] for r in rows[1:]) for k in rows[0]["us_per_object"]}
print(json.dumps({"tree": tree, "serving": round(sum(per.values()), 2), **per, "digest": digest}))
