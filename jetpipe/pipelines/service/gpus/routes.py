"""The control API of a daemon on several GPUs, answered by the face: the caller's token checked here, then each
request sent on to the worker that serves the stream (with that worker's own token, on loopback).

    GET    /streams          every worker's streams, each with its "gpu"
    POST   /streams          placed on the GPU with the most headroom (or `"gpu": N` in the body), sent on
                             there; a GPU with no free slot (409) passes it to the next
    GET, DELETE /streams/ID  and POST /streams/ID/clips: sent on to the stream's worker
    /rules                   not with --gpus yet: 501 (set zones and lines in the configuration)

The workers answer as one daemon does (control.py: its statuses and JSON errors).
"""

from __future__ import annotations

import json
import threading

from jetpipe.pipelines.config import SourceConfig
from jetpipe.pipelines.ingest.streams import ControlError
from jetpipe.pipelines.service.gpus import plan, scrape
from jetpipe.pipelines.service.http.control import JSON, error, json_body, ok, unauthorized

FORWARD_TIMEOUT_S = 45.0  # a DELETE waits up to 30 s for the stream's frames (REMOVE_WAIT_S), then says 202


class FaceRoutes:
    def __init__(self, face, token: str):
        self.face, self.token = face, token
        self.lock = threading.Lock()  # one placement at a time: two POSTs never both count the same headroom

    def handles(self, path: str) -> bool:
        return path == "/streams" or path.startswith("/streams/") or path == "/rules" or path.startswith("/rules/")

    def handle(self, method: str, path: str, authorization: str, body: bytes) -> tuple[int, str, str]:
        refusal = unauthorized(self.token, authorization)
        if refusal is not None:
            return refusal
        if path.startswith("/rules"):
            return error(501, "rules through the control API are not served with --gpus yet: set the zones and "
                               "lines in the configuration")
        if path == "/streams" and method == "GET":
            return self._list()
        if path == "/streams" and method == "POST":
            return self._add(body)
        if path == "/streams":
            return error(405, f"{method} /streams: use GET (list) or POST (add)")
        return self._to_owner(method, path, body)

    def _list(self) -> tuple[int, str, str]:
        streams, slots = [], 0
        for worker in self.face.serving():
            status, text = forward(worker, "GET", "/streams")
            if status != 200:
                continue
            answer = json.loads(text)
            slots += answer["max_streams"]
            streams += [{**s, "gpu": worker.gpu} for s in answer["streams"]]
        return ok(200, {"gpus": list(dict.fromkeys(w.gpu for w in self.face.serving())), "max_streams": slots,
                         "streams": sorted(streams, key=lambda s: s["id"])})

    def _add(self, body: bytes) -> tuple[int, str, str]:
        try:
            table = json_body(body, "/streams")
        except ControlError as exc:
            return error(exc.status, str(exc))
        if not isinstance(table, dict):
            return error(400, 'POST /streams: send one JSON object, e.g. {"uri": "rtsp://camera/stream"}')
        pin = table.get("gpu")
        serving = {w.number: w for w in self.face.serving()}
        gpus = sorted({w.gpu for w in serving.values()})
        if pin is not None and pin not in gpus:
            return error(400, f"POST /streams: gpu = {pin!r}: the GPUs served are {', '.join(map(str, gpus))}")
        with self.lock:
            rate = plan.offered_rate(SourceConfig(str(table.get("uri", ""))))
            status, text = 409, json.dumps({"error": "no GPU has a free slot"})
            # GPUs of one model measure a few per cent apart, noise: weighed only where the models differ
            capacities = None if self.face.alike else {g: w.hello.get("engine_fps") for g, w in serving.items()}
            for number in self.face.placed.order(rate, pin, list(serving), capacities):
                status, text = forward(serving[number], "POST", "/streams", body)
                if status == 201:
                    stream = json.loads(text)
                    self.face.placed.added(stream["id"], number, rate)
                    return ok(201, {**stream, "gpu": serving[number].gpu})
                if status != 409:  # the worker's no to this source (400, 403, 422): the same on every GPU
                    break
        return status, text, JSON

    def _to_owner(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        text = path[len("/streams/"):].removesuffix("/clips")
        number = self.face.placed.worker_of.get(int(text)) if text.isdigit() and len(text) <= 9 else None
        worker = next((w for w in self.face.serving() if w.number == number), None)
        if worker is None:
            return error(404, f"{path[:100]}: no such stream (GET /streams lists them)")
        status, answer = forward(worker, method, path, body)
        if method == "DELETE" and status in (200, 202):
            self.face.placed.removed(int(text))
        if status in (200, 201, 202) and answer.startswith("{"):
            return status, json.dumps({**json.loads(answer), "gpu": worker.gpu}) + "\n", JSON
        return status, answer, JSON


def forward(worker, method: str, path: str, body: bytes = b"") -> tuple[int, str]:
    """(status, body) of the request sent on to a worker's control API; 503 where it does not answer."""
    headers = {"Authorization": f"Bearer {worker.token}", "Content-Type": JSON}
    status, answer, _ = scrape.request(worker.hello["address"], path, method, body, headers, FORWARD_TIMEOUT_S)
    if not status:
        return 503, json.dumps({"error": f"{worker.who} does not answer ({answer.decode()}): "
                                         "try again"}) + "\n"
    return status, answer.decode(errors="replace")
