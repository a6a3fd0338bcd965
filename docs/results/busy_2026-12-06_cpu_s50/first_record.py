"""How long a jsonl sink takes to be made, then to write its first record of a busy frame (60 boxes): the
numbers' text tables (json_numbers) are made by one or the other.

  python first_record.py
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path[:0] = ["."]
from jetpipe.pipelines.core.record import FrameRecord  # noqa: E402
from jetpipe.pipelines.outputs.sinks import JsonlSink  # noqa: E402
from jetpipe.tasks.detections import Detections  # noqa: E402

folder = Path(tempfile.mkdtemp())
started = time.perf_counter()
sink = JsonlSink(f"jsonl:{folder / 'r.jsonl'}")
made = time.perf_counter()
rng = np.random.default_rng(1)
corner = rng.uniform(0, 1800, (60, 2))
found = Detections(np.concatenate([corner, corner + 80], 1), rng.uniform(0.3, 1, 60), np.zeros(60, np.int64),
                   layout=("boxes", "scores", "classes"))
record = FrameRecord(0, "cam", 0, 0.0, 0.0, 0.0, {"total": 1.0}, "detection", found)
writing = time.perf_counter()
sink.write(record)
written = time.perf_counter()
sink.close()
print(f"sink made in {1e3 * (made - started):.1f} ms, its first record written in {1e3 * (written - writing):.2f} ms")
