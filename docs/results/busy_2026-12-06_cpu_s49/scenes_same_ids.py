"""python scenes_same_ids.py OLD_TREE NEW_TREE: both trees' botsort.py on the built-in scenes (seeds 1-3; four
scenes of a seed a table, one frame of each a pass): how many frames got the same IDs from both."""
import importlib.util
import sys

old, new = sys.argv[1:3]
sys.path[:0] = [new]
import numpy as np  # noqa: E402

from jetpipe.calibration.tracking_scenes import SCENES, make_scene  # noqa: E402


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


trees = [load(f"{tree}/jetpipe/pipelines/core/tracking/botsort.py", f"botsort_{k}")
         for k, tree in enumerate((old, new))]
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
