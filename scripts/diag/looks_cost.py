#!/usr/bin/env python3
"""What a look costs: wall milliseconds of one Appearance.embed call (the tracker waits for it) by the number of
crops, for each --reid given, on this machine's runtime. A 1080p frame, boxes 60 x 160 spread over it.

  python scripts/diag/looks_cost.py colour [BUNDLE ...] [--counts 1,2,4,8,16,32] [--repeats 50]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from jetpipe.pipelines.core.tracking.appearance import Appearance
from jetpipe.runtime.api import Frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reid", nargs="+")
    parser.add_argument("--counts", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    frame = Frame(rng.integers(0, 255, (1080, 1920, 3), dtype=np.uint8), "bgr")
    for reid in args.reid:
        appearance = Appearance(reid)
        for count in [int(c) for c in args.counts.split(",")]:
            xy = rng.uniform([0, 0], [1850, 900], (count, 2))
            boxes = np.concatenate([xy, xy + [60, 160]], axis=1)
            appearance.embed([(frame, boxes)])  # warm: this shape's first run
            spent = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                appearance.embed([(frame, boxes)])
                spent.append(time.perf_counter() - started)
            ms = np.array(spent) * 1e3
            print(f"{reid} ({appearance.runtime.backend_name}): {count:3d} crops: median {np.median(ms):.2f} ms, "
                  f"p90 {np.percentile(ms, 90):.2f} ms", flush=True)
        appearance.close()


if __name__ == "__main__":
    main()
