"""`http://HOST[:PORT]/PATH` and `https://...`: each event POSTed as JSON to a web hook, at least once
(delivery.QueuedSink): a connection that fails, a timeout, a 408, 425, 429 or 5xx is retried with backoff;
any other answer but 2xx is the endpoint's no (counted lost and said, not retried). Redirects are not
followed (a 3xx is a no): the events go where the user said, nowhere else.

jetpipe's own options (records, queue, drain, timeout, token_env) are taken out of the URL's query; the rest
of it stays in the URL that is posted to. `token_env=NAME`: the bearer token is read from the environment
variable NAME (never written in the URI, which the log and the summary show).
"""

from __future__ import annotations

import http.client
import os
import ssl
from urllib.parse import parse_qsl, urlencode, urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks.base import port_of
from jetpipe.pipelines.outputs.sinks.delivery import QueuedSink, Undelivered, delivery_options

OPTIONS = ("records", "queue", "drain", "timeout", "token_env")
RETRY_STATUS = {408, 425, 429}  # and every 5xx: the endpoint may take it later
MAX_TIMEOUT_S = 120.0


def parse(spec: str) -> dict:
    """The sink's settings from its URL, without connecting (config checks call it before anything runs)."""
    parsed = urlparse(spec)
    query = parse_qsl(parsed.query, keep_blank_values=True)
    options = {k: v for k, v in query if k in OPTIONS}
    rest = [(k, v) for k, v in query if k not in OPTIONS]
    empty = [k for k, v in options.items() if not v]
    if empty:
        raise JetpipeError(f"sink {_shown(spec)}: option {empty[0]!r} is empty")
    port = port_of(parsed, _shown(spec))
    if not parsed.hostname:
        raise JetpipeError(f"sink {_shown(spec)}: name the host, e.g. http://127.0.0.1:8080/events")
    if parsed.username or parsed.password:
        raise JetpipeError(f"sink {_shown(spec)}: credentials in the URL would be shown in the log: put a bearer "
                           "token in an environment variable and add ?token_env=NAME")
    token = None
    if "token_env" in options:
        token = os.environ.get(options["token_env"])
        if not token:
            raise JetpipeError(f"sink {_shown(spec)}: token_env={options['token_env']}: that environment variable "
                               "is not set")
    try:
        timeout = float(options.get("timeout", "5"))
    except ValueError:
        timeout = -1.0
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise JetpipeError(f"sink {_shown(spec)}: timeout={options['timeout']!r}: seconds, above 0 and at most "
                           f"{MAX_TIMEOUT_S:g}")
    records, queue, drain = delivery_options(_shown(spec), options)
    target = (parsed.path or "/") + (f"?{urlencode(rest)}" if rest else "")
    return {"https": parsed.scheme == "https", "host": parsed.hostname, "port": port, "target": target,
            "token": token, "timeout": timeout, "records": records, "queue": queue, "drain": drain}


def _shown(spec: str) -> str:
    """The URL as the log may show it: no query (it may carry a key), no credentials."""
    parsed = urlparse(spec)
    netloc = parsed.netloc.rpartition("@")[2]
    return f"{parsed.scheme}://{netloc}{parsed.path}"


class WebhookSink(QueuedSink):
    def __init__(self, spec: str):
        settings = parse(spec)
        super().__init__(settings["records"], settings["queue"], settings["drain"])
        self.shown, self.target, self.timeout = _shown(spec), settings["target"], settings["timeout"]
        self.host, self.port, self.https = settings["host"], settings["port"], settings["https"]
        self.headers = {"Content-Type": "application/json", "User-Agent": "jetpipe"}
        if settings["token"]:
            self.headers["Authorization"] = f"Bearer {settings['token']}"
        self.connection = None
        self.start()

    def describe(self) -> str:
        return self.shown

    def _connect(self):
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def send(self, batch: list) -> None:
        for i, record in enumerate(batch):
            try:
                status, reason = self._post(record.json().encode())
            except (OSError, http.client.HTTPException) as exc:
                self.reconnect()
                raise Undelivered(i, str(exc) or type(exc).__name__) from exc
            if 200 <= status < 300:
                continue
            if status in RETRY_STATUS or status >= 500:
                raise Undelivered(i, f"HTTP {status} {reason}")
            self.refuse(f"HTTP {status} {reason}" + (" (redirects are not followed)" if 300 <= status < 400 else ""))

    def _post(self, body: bytes) -> tuple[int, str]:
        """One POST on the kept-alive connection; where the endpoint had closed it, once more on a new one."""
        if self.connection is not None:
            try:
                return self._request(body)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.reconnect()
        self.connection = self._connect()
        return self._request(body)

    def _request(self, body: bytes) -> tuple[int, str]:
        self.connection.request("POST", self.target, body=body, headers=self.headers)
        response = self.connection.getresponse()
        response.read()  # the whole answer, so that the connection can carry the next request
        if response.will_close:
            self.reconnect()
        return response.status, response.reason

    def reconnect(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def disconnect(self) -> None:
        self.reconnect()
