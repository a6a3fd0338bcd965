"""The live preview page on the metrics server: every stream's latest annotated frame and its counters.

`/` is a small page that refreshes each stream's JPEG (`/preview/N.jpg`) five times a second and its fps,
latency and drop counters (`/stats.json`) once a second. Frames for it are drawn only while someone
watches (a preview JPEG was asked for in the last few seconds), at most `fps` per stream: an unwatched
daemon pays one time check per frame.
"""

from __future__ import annotations

import html
import json
import time

import numpy as np

from jetpipe.lazy import lazy_import
from jetpipe.pipelines import annotate
from jetpipe.pipelines.frame_sinks import FrameSink

cv2 = lazy_import("cv2")

WIDTH = 640      # drawn preview frames are at most this wide
IDLE_S = 3.0     # nobody asked for a frame this long: stop drawing


class Preview(FrameSink):
    def __init__(self, streams: int, max_batch: int = 8, fps: float = 5.0):
        self.last_request = -1e9
        self.latest: dict[int, bytes] = {}
        self.drawn = 0
        super().__init__("preview", max_batch, max_fps=fps)
        self.by_pts = False  # a viewer's rate: frames per second of watching

    def watched(self) -> bool:
        return time.monotonic() - self.last_request < IDLE_S

    def offer(self, stream: int, frame, record: dict, to_host=None, wait: bool = False) -> bool:
        if not self.watched():
            return False  # nobody looks: no copy, not a drop
        return super().offer(stream, frame, record, to_host)  # a viewer's frame never waits

    def consume(self, stream: int, frame: np.ndarray, fmt: str, record: dict) -> None:
        image = annotate.render(frame, fmt, record["results"], WIDTH)
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
        if ok:
            self.latest[stream] = jpeg.tobytes()
            self.drawn += 1

    def jpeg(self, stream: int) -> bytes | None:
        """The stream's latest drawn frame; asking for it is what keeps the preview drawing."""
        self.last_request = time.monotonic()
        return self.latest.get(stream)


def page(sources: list[str]) -> str:
    figures = "\n".join(
        f'<figure><img id="s{i}" alt="stream {i}" width="{WIDTH}"><figcaption>{i}: {html.escape(uri)} '
        f'<span id="t{i}"></span></figcaption></figure>' for i, uri in enumerate(sources))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jetpipe preview</title>
<style>body{{font:14px sans-serif;margin:8px;background:#222;color:#ddd}} figure{{display:inline-block;margin:4px}}
img{{display:block;background:#000;min-height:120px}}</style></head>
<body><div id="summary">jetpipe</div>
{figures}
<script>
const streams = {len(sources)};
function frames() {{
  for (let i = 0; i < streams; i++) document.getElementById("s" + i).src = "/preview/" + i + ".jpg?t=" + Date.now();
}}
async function stats() {{
  try {{
    const s = await (await fetch("/stats.json")).json();
    document.getElementById("summary").textContent = `processed ${{s.processed}} dropped ${{s.dropped}}`;
    s.streams.forEach((t, i) => document.getElementById("t" + i).textContent =
      `${{t.fps.toFixed(1)}} fps, p50 ${{t.p50_ms}} ms, p99 ${{t.p99_ms}} ms, dropped ${{t.dropped}}`);
  }} catch (e) {{}}
}}
frames(); stats(); setInterval(frames, 200); setInterval(stats, 1000);
</script></body></html>
"""


def stats_json(metrics, dropped: list[int]) -> str:
    """Every stream's fps, counters and its own latency percentiles (capture to result)."""
    def stream(i):
        latency = metrics.stream_percentiles(i)
        return {"fps": metrics.fps(i), "processed": metrics.processed[i], "dropped": dropped[i],
                "p50_ms": round(latency.get(0.5, 0.0), 1), "p99_ms": round(latency.get(0.99, 0.0), 1)}

    return json.dumps({"processed": sum(metrics.processed), "dropped": sum(dropped),
                       "streams": [stream(i) for i in range(len(dropped))]})
