#!/usr/bin/env python3
"""Issue 65's "line counts exact": two lines across the built-in scenes (x = 850 and 1400 of 1920, drawn top
to bottom: moving right is "in"), each scene's detections through a tracker and the events engine, against
the people who crossed (first and last detected centre more than 50 px either side of the line, the
direction from where they were first seen to where they were last seen). Prints got / truth per line and
direction; "exact" where every count lies between that truth and the truth with 15 px for 50 (a person the
scene's end leaves just past a line has crossed it for the rules, not for the 50-px truth).

    python scripts/diag/line_counts.py [--seeds 7,8] [--scenes pillars,groups,stop_and_go,crossing]

botsort+looks: botsort given simulated looks of a good ReID network (tracking_scenes.SimulatedLooks(0.7)).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jetpipe.calibration.tracking_scenes import WIDTH, SimulatedLooks, make_scene  # noqa: E402
from jetpipe.pipelines.core.events.engine import Engine  # noqa: E402
from jetpipe.pipelines.core.events.rules import Line  # noqa: E402
from jetpipe.pipelines.core.tracking import make_tracker  # noqa: E402
from jetpipe.tasks.detections import Detections  # noqa: E402

LINES = (850, 1400)


def counted(scene, tracker: str, looks=None) -> dict:
    engine = Engine()
    engine.rules = [engine.rule(Line(f"x{x}", [[x / WIDTH, 0], [x / WIDTH, 1]]), None) for x in LINES]
    tracks, got = make_tracker(tracker), {}
    for f in scene.frames:
        ids = tracks.update(f.boxes, f.scores, f.t) if looks is None else \
            tracks.table.update([(0, f.boxes, f.scores, f.t)], looks.embed_for(f))[0]
        found = Detections(f.boxes, f.scores, np.zeros(len(ids)), layout=("boxes", "scores", "classes"),
                           tracker_id=ids)
        for _, h in engine.decide([(0, f.t, (1080, WIDTH), found)]):
            key = (h.rule, h.fields["direction"])
            got[key] = got.get(key, 0) + 1
    return got


def truth(scene, margin: float = 50.0) -> dict:
    centres: dict[int, list[float]] = {}
    for f in scene.frames:
        for person, box in zip(f.truth.tolist(), f.boxes):
            if person >= 0:
                centres.setdefault(person, []).append((box[0] + box[2]) / 2)
    crossed: dict = {}
    for x in LINES:
        for xs in centres.values():
            if min(xs) < x - margin and max(xs) > x + margin:
                key = (f"x{x}", "in" if xs[0] < xs[-1] else "out")
                crossed[key] = crossed.get(key, 0) + 1
    return crossed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="7,8")
    parser.add_argument("--scenes", default="pillars,groups,stop_and_go,crossing")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in args.scenes.split(","):
            scene = make_scene(name, 30.0, seconds=20, seed=seed)
            want, loose = truth(scene), truth(scene, 15.0)  # loose: crossed by 15 px at the scene's end too
            for tracker in ("botsort", "bytetrack", "botsort+looks"):  # looks: simulated, a good ReID's
                looks = SimulatedLooks(0.7, seed=seed) if tracker.endswith("looks") else None
                got = counted(scene, tracker.removesuffix("+looks"), looks)
                keys = sorted(set(got) | set(want))
                right = all(want.get(k, 0) <= got.get(k, 0) <= loose.get(k, 0) for k in set(got) | set(loose))
                print(f"seed {seed} {name:12s} {tracker:13s} {'exact' if right else 'off  '} "
                      + " ".join(f"{r}/{d} {got.get((r, d), 0)}/{want.get((r, d), 0)}" for r, d in keys), flush=True)


if __name__ == "__main__":
    main()
