"""python scenes_same_ids.py OLD_TREE NEW_TREE: both trees' botsort.py on the built-in scenes (seeds 1-3; four
scenes of a seed a table, one frame of each a pass): how many frames got the same IDs from both."""
import sys

from tracker_ab import load  # this folder's

old, new = sys.argv[1:3]
sys.path[:0] = [new]
import numpy as np  # noqa: E402

from jetpipe.calibration.tracking_scenes import SCENES, make_scene  # noqa: E402

trees = [load(old, "botsort_old"), load(new, "botsort_new")]
for name in SCENES:
    for seed in (1, 2, 3):
        scenes = [make_scene(name, seconds=8, seed=seed * 10 + s) for s in range(4)]
        tables = [tree.BotSortTable(first_ids=[1] * 4) for tree in trees]
        same = total = 0
        for k in range(len(scenes[0].frames)):
            batch = [(s, scene.frames[k].boxes, scene.frames[k].scores, scene.frames[k].t)
                     for s, scene in enumerate(scenes)]
            a, b = (table.update(batch) for table in tables)
            same += sum(np.array_equal(x, y) for x, y in zip(a, b))
            total += len(a)
        print(name, seed, f"{same}/{total} frames with equal IDs")
