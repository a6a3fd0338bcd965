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
from jetpipe.pipelines.outputs import annotate
from jetpipe.pipelines.outputs.sinks.frames import FrameSink

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

    def offer(self, stream: int, frame, record, to_host=None, wait: bool = False) -> bool:
        if not self.watched():
            return False  # nobody looks: no copy, not a drop
        return super().offer(stream, frame, record, to_host)  # a viewer's frame never waits

    def consume(self, stream: int, frame: np.ndarray, fmt: str, record) -> None:
        image = annotate.render(frame, fmt, record.detections, WIDTH, record.scene)
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
        if ok:
            self.latest[stream] = jpeg.tobytes()
            self.drawn += 1

    def finish_stream(self, stream: int) -> None:
        self.latest.pop(stream, None)  # a removed stream's last frame is not shown

    def jpeg(self, stream: int) -> bytes | None:
        """The stream's latest drawn frame; asking for it is what keeps the preview drawing."""
        self.last_request = time.monotonic()
        return self.latest.get(stream)


def page(streams: list[tuple[int, str]]) -> str:
    """streams: (ID, URI) of each stream now; the page follows streams added and removed (stats.json lists
    them) without a reload."""
    figures = "\n".join(_figure(i, uri) for i, uri in streams)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jetpipe preview</title>
<style>body{{font:14px sans-serif;margin:8px;background:#222;color:#ddd}} figure{{display:inline-block;margin:4px}}
img{{display:block;background:#000;min-height:120px}}</style></head>
<body><div id="summary">jetpipe</div>
<div id="streams">
{figures}
</div>
<script>
let ids = {json.dumps([i for i, _ in streams])};
function frames() {{
  for (const i of ids) document.getElementById("s" + i).src = "/preview/" + i + ".jpg?t=" + Date.now();
}}
function follow(streams) {{
  const now = streams.map(t => t.id);
  for (const i of ids) if (!now.includes(i)) document.getElementById("f" + i).remove();
  for (const t of streams) if (!ids.includes(t.id)) {{
    const f = document.createElement("figure");
    f.id = "f" + t.id;
    f.innerHTML = `<img id="s${{t.id}}" alt="stream ${{t.id}}" width="{WIDTH}"><figcaption></figcaption>`;
    f.querySelector("figcaption").textContent = t.id + ": " + t.uri + " ";
    const span = document.createElement("span");
    span.id = "t" + t.id;
    f.querySelector("figcaption").appendChild(span);
    document.getElementById("streams").appendChild(f);
  }}
  ids = now;
}}
async function stats() {{
  try {{
    const s = await (await fetch("/stats.json")).json();
    follow(s.streams);
    document.getElementById("summary").textContent = `processed ${{s.processed}} dropped ${{s.dropped}}`;
    s.streams.forEach(t => document.getElementById("t" + t.id).textContent =
      `${{t.fps.toFixed(1)}} fps, p50 ${{t.p50_ms}} ms, p99 ${{t.p99_ms}} ms, dropped ${{t.dropped}}`);
  }} catch (e) {{}}
}}
frames(); stats(); setInterval(frames, 200); setInterval(stats, 1000);
</script></body></html>
"""


def _figure(stream: int, uri: str) -> str:
    return (f'<figure id="f{stream}"><img id="s{stream}" alt="stream {stream}" width="{WIDTH}"><figcaption>'
            f'{stream}: {html.escape(uri)} <span id="t{stream}"></span></figcaption></figure>')


def stats_json(metrics, dropped: list[int], streams: list[tuple[int, int, str]] | None = None) -> str:
    """Every stream's fps, counters and its own latency percentiles (capture to result). streams: (slot, ID,
    URI) of each stream now (default: one per slot, ID = slot)."""
    def stream(slot, stream_id, uri):
        latency = metrics.stream_percentiles(slot)
        return {"id": stream_id, "uri": uri, "fps": metrics.fps(slot), "processed": metrics.processed[slot],
                "dropped": dropped[slot], "p50_ms": round(latency.get(0.5, 0.0), 1),
                "p99_ms": round(latency.get(0.99, 0.0), 1)}

    streams = streams if streams is not None else [(i, i, "") for i in range(len(dropped))]
    shown = [stream(*s) for s in streams]
    return json.dumps({"processed": sum(s["processed"] for s in shown), "dropped": sum(s["dropped"] for s in shown),
                       "streams": shown})
