"""The face's own pages over every worker: /metrics (each worker's, labelled with its GPU, and its worker where a
GPU has several), /healthz,
/streams (without the control API) and the preview (one page; each picture from the worker that draws it)."""

from __future__ import annotations

import json

from jetpipe.pipelines.outputs import preview
from jetpipe.pipelines.service.gpus import scrape


class FacePages:
    def __init__(self, face):
        self.face = face

    def render_metrics(self) -> str:
        texts = {}
        for worker in self.face.serving():
            status, text = scrape.fetch(worker.hello["address"], "/metrics")
            if status == 200:
                texts[scrape.labels(worker.gpu, worker.k)] = text
        return scrape.merge(texts)

    def health(self) -> tuple[bool, str]:
        if self.face.stopping.is_set():
            return False, "stopping"
        for worker in self.face.workers:
            if not worker.alive():
                return False, f"{worker.who} {worker.ended()}"
            if worker.hello is None:
                return False, f"{worker.who} is starting again"
            status, why = scrape.fetch(worker.hello["address"], "/healthz")
            if status != 200:
                return False, f"{worker.name}: {why.strip()}"
        return True, "ok"

    def pages(self, path: str):
        """/streams (without the control API), and the preview: its page over every GPU's streams, their
        stats.json merged, and each stream's picture from its worker."""
        if path in ("/", "/index.html", "/stats.json") or path.startswith("/preview/"):
            return self._preview(path)
        if path != "/streams":
            return None
        worker_of = {i: w for w in self.face.workers for i in w.ids}
        streams = [{"id": i, "uri": uri, "gpu": worker_of[i].gpu, "worker": "serving" if worker_of[i].alive()
                    else worker_of[i].ended()} for i, uri in enumerate(self.face.uris) if i in worker_of]
        gpus = list(dict.fromkeys(w.gpu for w in self.face.workers))
        return 200, json.dumps({"gpus": gpus, "streams": streams}), "application/json"

    def _preview(self, path: str):
        if path.startswith("/preview/"):
            text = path[len("/preview/"):].removesuffix(".jpg")
            number = self.face.placed.worker_of.get(int(text)) if text.isdigit() and len(text) <= 9 else None
            worker = next((w for w in self.face.serving() if w.number == number), None)
            if worker is None:
                return None
            status, body, ctype = scrape.fetch_bytes(worker.hello["address"], path)
            return (status, body, ctype) if status else (503, b"its GPU's worker does not answer\n", "text/plain")
        answers = (scrape.fetch(w.hello["address"], "/stats.json") for w in self.face.serving())
        texts = [text for status, text in answers if status == 200]
        merged = scrape.stats(texts)
        if path == "/stats.json":
            return 200, merged, "application/json"
        shown = [(s["id"], s["uri"]) for s in json.loads(merged)["streams"]]
        return 200, preview.page(shown), "text/html; charset=utf-8"
