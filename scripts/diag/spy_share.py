#!/usr/bin/env python3
"""Where a py-spy profile's samples went (issue 66: what holds the GIL in a busy run), by thread and by function.

  python scripts/diag/spy_share.py STACKS.txt[.gz] [--top 12]

STACKS: `py-spy record --format raw` (scripts/bench_busy.py --py-spy writes it with --gil: only the GIL
holder's samples). A thread is named by its loop, the frame after the daemon's thread entry
(`Pipeline._thread.<locals>.run`: StageLoops.post_loop, CaptureGroup._run, SinkFanout.run, ...) or the
stack's first frame (the main thread, a pool's worker). Printed: each thread's share of all samples, then its
--top jetpipe functions by samples under them (inclusive) and the innermost frames its samples were in
(exclusive).
"""

from __future__ import annotations

import argparse
import gzip
from collections import Counter, defaultdict
from pathlib import Path

ENTRY = "Pipeline._thread.<locals>.run"


def stacks(path: Path):
    """(frames, samples) of each line: 'frame;frame;... count'."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                yield stack.split(";"), int(count)


def thread_of(frames: list[str]) -> str:
    names = [f.split(" (", 1)[0] for f in frames]
    if ENTRY in names and names.index(ENTRY) + 1 < len(names):
        return names[names.index(ENTRY) + 1]
    return names[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks", type=Path)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    by_thread: Counter = Counter()
    inclusive: dict[str, Counter] = defaultdict(Counter)
    innermost: dict[str, Counter] = defaultdict(Counter)
    for frames, count in stacks(args.stacks):
        thread = thread_of(frames)
        by_thread[thread] += count
        for name in {f.split(" (", 1)[0] for f in frames if "jetpipe/" in f} - {ENTRY, thread}:
            inclusive[thread][name] += count
        innermost[thread][frames[-1]] += count
    total = sum(by_thread.values())
    print(f"{total} samples")
    for thread, count in by_thread.most_common():
        print(f"\n{thread}: {count} samples, {100 * count / total:.1f} %")
        for name, n in inclusive[thread].most_common(args.top):
            print(f"  {100 * n / total:5.1f} %  under {name}")
        for name, n in innermost[thread].most_common(min(args.top, 6)):
            print(f"  {100 * n / total:5.1f} %  in    {name[:110]}")


if __name__ == "__main__":
    main()
