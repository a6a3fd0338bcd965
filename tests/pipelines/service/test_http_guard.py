"""The metrics server's request checks (http_guard) and the control API's start-up options, without a server."""

import pytest

from jetpipe.pipelines.config import ConfigError, ControlConfig, PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.service.http import guard as http_guard

LOOPBACK = ("localhost",)


@pytest.mark.parametrize("host, names, loopback_only, allowed", [
    ("127.0.0.1:9108", LOOPBACK, True, True),
    ("localhost:9108", LOOPBACK, True, True),
    ("LOCALHOST", LOOPBACK, True, True),
    ("[::1]:9108", LOOPBACK, True, True),
    ("app.localhost:9108", LOOPBACK, True, True),       # RFC 6761: always loopback
    ("evil.example:9108", LOOPBACK, True, False),       # DNS rebinding: the page's own name
    ("localhost.evil.example", LOOPBACK, True, False),
    ("192.168.1.50:9108", LOOPBACK, True, False),       # a loopback server reached by another address: a proxy
    ("192.168.1.50:9108", ("localhost", "edge-7"), False, True),
    ("edge-7:9108", ("localhost", "edge-7"), False, True),
    ("edge-7.:9108", ("localhost", "edge-7"), False, True),
    ("edge-8:9108", ("localhost", "edge-7"), False, False),
    ("anything", ("localhost", "*"), False, True),
    ("", LOOPBACK, True, False),
    ("[::1", LOOPBACK, True, False),
])
def test_a_request_is_answered_only_for_the_hosts_this_server_is_reached_by(host, names, loopback_only, allowed):
    assert http_guard.allowed_host(host, names, loopback_only) is allowed


@pytest.mark.parametrize("method, origin, fetch_site, refused", [
    ("POST", None, None, False),                                 # curl, a script
    ("POST", "http://127.0.0.1:9108", "same-origin", False),     # the daemon's own page
    ("POST", "HTTP://127.0.0.1:9108/", None, False),
    ("POST", "http://evil.example", "cross-site", True),
    ("POST", "http://evil.example", None, True),
    ("DELETE", "null", None, True),                              # a sandboxed frame, a file:// page
    ("POST", None, "same-site", True),                           # another port of the same host
    ("POST", "http://127.0.0.1:9109", None, True),
    ("GET", "http://evil.example", "cross-site", False),         # reads: the browser keeps the answer from it
])
def test_a_mutating_request_from_another_site_is_refused(method, origin, fetch_site, refused):
    assert bool(http_guard.cross_site(method, origin, fetch_site, "127.0.0.1:9108")) is refused


def test_bearer_schemes_are_case_insensitive_and_nothing_else_is_a_token():
    assert http_guard.bearer_token("Bearer abc") == "abc"
    assert http_guard.bearer_token("bearer  abc ") == "abc"
    assert http_guard.bearer_token("Basic abc") == ""
    assert http_guard.bearer_token("abc") == ""


def test_json_nesting_is_measured_before_parsing():
    assert http_guard.json_depth(b'{"uri": "a[[[{{{"}') == 1
    assert http_guard.json_depth(b'{"uri": "\\"[[["}') == 1
    assert http_guard.json_depth(b'{"a": [[{"b": 1}]]}') == 4
    assert http_guard.json_depth(b"[" * 60000) == 60000
    assert http_guard.is_json("application/json; charset=utf-8") and not http_guard.is_json("text/plain")


def _config(tmp_path, **control):
    return PipelineConfig(bundle=tmp_path, sources=[SourceConfig("synthetic")],
                          control=ControlConfig(enabled=True, **control))


@pytest.mark.parametrize("control, message", [
    ({"allow_schemes": ["gsr"]}, "allow_schemes: 'gsr': choose from"),
    ({"allow_schemes": ["file"]}, "files: allow_folders"),
    ({"allow_folders": ["/no/such/folder"]}, "is not a folder"),
])
def test_what_the_control_api_may_start_is_checked_at_start_up(tmp_path, control, message):
    with pytest.raises(ConfigError, match=message):
        validate(_config(tmp_path, **control))


def test_metrics_host_names_are_checked_at_start_up(tmp_path):
    config = _config(tmp_path)
    config.metrics_hosts = ["edge-7", "edge-7.example.com", "*"]
    validate(config)
    config.metrics_hosts = ["http://edge-7/"]
    with pytest.raises(ConfigError, match="is not a host name"):
        validate(config)
