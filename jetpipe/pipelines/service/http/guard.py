"""What the metrics server lets a caller do: the checks every request passes before it is answered.

The threat is a caller the operator did not mean, above all a web page in the user's browser:
  - DNS rebinding: a page's own name made to resolve to 127.0.0.1 (or the device's address) reads the
    preview and the stream list as its own origin. Its requests carry that name in `Host`; a request is
    answered only when `Host` is a name this server is meant to be reached by (`allowed_host`).
  - Cross-site requests: any page may POST to 127.0.0.1 with a `text/plain` body and no preflight. A
    mutating call needs `Content-Type: application/json` (which a browser sends cross-site only after a
    CORS preflight this server never grants) and no foreign `Origin` / `Sec-Fetch-Site` (`cross_site`).
Everything here is pure, so it is tested without a server.
"""

from __future__ import annotations

import ipaddress
import socket

from jetpipe.uri import is_loopback_host

MAX_JSON_DEPTH = 4  # a source spec is one flat object; deeper nesting is refused before it is parsed
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def host_check(listen: str, extra_names=()):
    """allows(host_header) for a server listening on `listen`: on a loopback address loopback names and
    addresses only; beyond it also IP literals and this machine's own host name (and NAME.local, as mDNS gives
    it); `extra_names` besides ("*": any). A rebinding needs a name, so IP literals are safe to answer."""
    loopback_only = is_loopback_host(listen.rpartition(":")[0].strip("[]"))
    name = socket.gethostname().lower()
    names = ("localhost",) if loopback_only else ("localhost", name, f"{name}.local")
    names += tuple(h.lower() for h in extra_names)
    return lambda header: header is not None and allowed_host(header, names, loopback_only)


def allowed_host(host_header: str, names: tuple[str, ...], loopback_only: bool) -> bool:
    """Whether a request's Host (HOST or HOST:PORT) is one this server is reached by: an IP literal (only a
    loopback one when it listens on loopback), a name in `names` ("*" allows any), or a subdomain of
    localhost (RFC 6761: always loopback)."""
    host = _host_part(host_header)
    if not host:
        return False
    if "*" in names:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host in names or host.endswith(".localhost") and "localhost" in names
    return address.is_loopback or not loopback_only


def cross_site(method: str, origin: str | None, fetch_site: str | None, host_header: str) -> str | None:
    """Why a mutating request is refused as coming from another site, or None. A request without Origin
    (curl, a script, an orchestrator) is not a browser's cross-site request."""
    if method not in MUTATING:
        return None
    if fetch_site and fetch_site.lower() not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {fetch_site}"
    if origin is None:
        return None
    scheme, _, rest = origin.partition("://")
    if scheme.lower() not in ("http", "https") or rest.lower().rstrip("/") != host_header.lower():
        return f"Origin {origin[:80]} is not this server ({host_header[:80]})"
    return None


def is_json(content_type: str | None) -> bool:
    """Content-Type application/json, parameters (charset) allowed."""
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/json"


def bearer_token(authorization: str) -> str:
    """The token of `Authorization: Bearer TOKEN` (the scheme in any case, RFC 9110), or ''."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def json_depth(body: bytes) -> int:
    """How deeply the JSON text's arrays and objects nest (brackets inside strings do not count): measured
    before parsing, so a body of 60,000 '[' is refused, not a RecursionError."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _host_part(host_header: str) -> str:
    """The host of a Host header, lowercased, without the port or an IPv6 literal's brackets."""
    text = host_header.strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else ""
    name, sep, port = text.rpartition(":")
    if sep and port.isdigit():
        text = name
    return text.rstrip(".")
