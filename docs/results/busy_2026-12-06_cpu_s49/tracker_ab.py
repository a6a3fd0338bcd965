"""python tracker_ab.py OLD_TREE NEW_TREE PASSES.pkl [RUNS]: both trees' botsort.py in one process (the modules
it imports are the same in both), RUNS runs each alternated: min and median CPU per detection, and a digest of
every frame's IDs (equal trees' results: equal digests)."""
import hashlib
import importlib.util
import pickle
import sys
import time


def load(tree: str, name: str):
    """TREE's botsort.py as module `name` (beside the other tree's, sharing the modules it imports)."""
    spec = importlib.util.spec_from_file_location(name, f"{tree}/jetpipe/pipelines/core/tracking/botsort.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    old, new, passes = sys.argv[1:4]
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 24
    sys.path[:0] = [new]
    arms = {"old": load(old, "botsort_old"), "new": load(new, "botsort_new")}
    batches = pickle.loads(open(passes, "rb").read())
    dets = sum(len(b) for f in batches for _, b, *_ in f)
    times = {k: [] for k in arms}
    digests = {}
    for run in range(runs):
        for name, module in (list(arms.items()) if run % 2 == 0 else list(arms.items())[::-1]):
            table = module.BotSortTable(first_ids=[1] * 16)
            digest = hashlib.sha256()
            t = time.thread_time()
            for frames in batches:
                for ids in table.update(frames):
                    digest.update(ids.tobytes())
            times[name].append(time.thread_time() - t)
            digests[name] = digest.hexdigest()[:10]
    for name, spent in times.items():
        spent = sorted(spent)
        print(name, f"min {1e6 * spent[0] / dets:.3f} median {1e6 * spent[len(spent) // 2] / dets:.3f} us a "
              "detection", digests[name])


if __name__ == "__main__":
    main()
