"""The workers' /metrics, /healthz and preview as the face answers them: each worker's text, its samples labelled with
its GPU, the families merged (Prometheus' text format wants a family's samples together, under one HELP and
TYPE)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

SCRAPE_TIMEOUT_S = 2.0


def fetch(address: str, path: str) -> tuple[int, str]:
    """(status, body) of GET http://address/path from a worker's server on loopback; (0, why) where none came."""
    status, body, _ = fetch_bytes(address, path)
    return status, body.decode(errors="replace")


def fetch_bytes(address: str, path: str) -> tuple[int, bytes, str]:
    """(status, body, content type) of GET http://address/path; (0, why, text/plain) where none came."""
    return request(address, path)


def request(address: str, path: str, method: str = "GET", body: bytes = b"", headers: dict | None = None,
            timeout: float = SCRAPE_TIMEOUT_S) -> tuple[int, bytes, str]:
    """(status, body, content type) of a request to a worker's server on loopback (the face's way to each
    worker: its pages and its control API); (0, why, text/plain) where no answer came."""
    sent = urllib.request.Request(f"http://{address}{path}", data=body or None, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(sent, timeout=timeout) as reply:  # noqa: S310 (loopback)
            return reply.status, reply.read(), reply.headers.get("Content-Type", "text/plain")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "text/plain")
    except (OSError, ValueError) as exc:
        return 0, str(exc).encode(), "text/plain"


def stats(texts: list[str]) -> str:
    """The preview's /stats.json of every worker as one: their streams by ID, the totals summed."""
    shown = sorted((s for text in texts for s in json.loads(text)["streams"]), key=lambda s: s["id"])
    return json.dumps({"processed": sum(s["processed"] for s in shown), "dropped": sum(s["dropped"] for s in shown),
                       "streams": shown})


def labels(gpu: int, k: int) -> str:
    """A worker's labels: `gpu="0"`, and `worker="2"` where its GPU has several (k: its place among them, from 1;
    0: the GPU's only worker)."""
    return f'gpu="{gpu}"' + (f',worker="{k}"' if k else "")


def merge(texts: dict[int | str, str]) -> str:
    """One exposition from each worker's (keyed by its labels, or by its GPU's number): every sample gets them
    (gpu="N"), each family once, in the order first seen."""
    families: dict[str, dict] = {}
    for key, text in texts.items():
        added = key if isinstance(key, str) else f'gpu="{key}"'
        current = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                current = families.setdefault(name, {"help": None, "type": None, "samples": []})
                current["help" if line[2] == "H" else "type"] = current["help" if line[2] == "H" else "type"] or line
            elif line and not line.startswith("#"):
                if current is None:
                    current = families.setdefault("", {"help": None, "type": None, "samples": []})
                current["samples"].append(labelled(line, added))
    out = []
    for family in families.values():
        out += [line for line in (family["help"], family["type"]) if line] + family["samples"]
    return "\n".join(out) + "\n"


def labelled(sample: str, added: str) -> str:
    """added `gpu="0"`: `name{a="b"} 1` -> `name{gpu="0",a="b"} 1`; `name 1` -> `name{gpu="0"} 1`."""
    brace = sample.find("{")
    space = sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        inner = sample[brace + 1:]
        return f'{sample[:brace]}{{{added}{"," if not inner.startswith("}") else ""}{inner}'
    return f'{sample[:space]}{{{added}}}{sample[space:]}'
