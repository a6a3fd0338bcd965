"""The preview's pages on the HTTP server: `/` (the page), `/stats.json` (its counters), `/preview/ID.jpg`."""

from __future__ import annotations

from jetpipe.pipelines.outputs import preview


class PreviewPages:
    """Answers the preview's paths for the streams in their slots now (None: not a page here)."""

    def __init__(self, streams, metrics, batcher, viewer: preview.Preview):
        self.streams, self.metrics, self.batcher, self.viewer = streams, metrics, batcher, viewer

    def __call__(self, path: str):
        live = self.streams.live()
        if path in ("/", "/index.html"):
            return 200, preview.page([(s.id, s.spec.uri) for s in live]), "text/html; charset=utf-8"
        if path == "/stats.json":
            shown = [(s.slot, s.id, s.spec.uri) for s in live]
            return 200, preview.stats_json(self.metrics, self.batcher.dropped, shown), "application/json"
        if path.startswith("/preview/") and path.endswith(".jpg"):
            stream = path[len("/preview/"):-len(".jpg")]
            if not stream.isdigit() or all(s.id != int(stream) for s in live):
                return None
            jpeg = self.viewer.jpeg(int(stream))
            return (200, jpeg, "image/jpeg") if jpeg else (503, "no frame drawn yet\n", "text/plain")
        return None
