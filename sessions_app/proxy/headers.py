"""What of a proxied request's headers reaches the program, and what of its answer reaches the
browser. The program runs where a neighbour may answer in its place, so it gets none of the
platform's cookies or credentials and may set nothing outside its session's path.

Cookies are filtered by name on the raw header, split on ";" by hand: a parser that honours
quotes (SimpleCookie) reads ``a="x; sessionid=...; b=y"`` as one cookie and would send the
platform's session inside its value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.conf import settings

# Connection-level, or re-made by the proxy for each side.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
# The platform's credentials: never sent to a node (cookies go through request_cookies).
PLATFORM_REQUEST = frozenset({b"authorization", b"cookie", b"x-csrftoken"})
# What a program may not say for the platform's origin: widen a service worker's scope beyond
# its path, wipe the platform's cookies and storage, or point the browser at another server.
REFUSED_RESPONSE = frozenset({b"service-worker-allowed", b"clear-site-data", b"alt-svc"})


def platform_cookies() -> frozenset[str]:
    return frozenset({settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME})


def _cookie_name(pair: str) -> str:
    return pair.split("=", 1)[0].strip()


def request_cookies(raw: Iterable[bytes], login: Mapping[str, str]) -> str:
    """The browser's Cookie headers minus the platform's cookies and any the program's login
    replaces, each kept byte for byte, then the login's own."""
    dropped = platform_cookies() | set(login)
    kept = []
    for header in raw:
        for pair in header.decode("latin-1").split(";"):
            pair = pair.strip()
            if pair and _cookie_name(pair) not in dropped:
                kept.append(pair)
    kept += [f"{name}={value}" for name, value in login.items()]
    return "; ".join(kept)


def set_cookie(value: bytes, prefix: str, *, keeps_prefix: bool) -> bytes | None:
    """A program's Set-Cookie as the browser may have it, or None to drop it.

    ``prefix`` is the session's path (/s/<id>/). A cookie named as one of the platform's is
    dropped; Domain goes; Path stays under the prefix: put under it for programs served at their
    root, replaced by it for those that serve under it themselves and name a path outside.
    """
    pair, *attributes = value.decode("latin-1").split(";")
    name, named, _ = pair.partition("=")
    # A nameless cookie reaches the platform as its bare value, which may read "sessionid=...".
    if not named or not name.strip() or name.strip() in platform_cookies():
        return None
    base = prefix.rstrip("/")
    kept = [pair.strip()]
    path = None
    for attribute in attributes:
        name, _, given = attribute.strip().partition("=")
        lower = name.strip().lower()
        if lower == "domain" or not name.strip():
            continue
        if lower == "path":
            path = given.strip()
            continue
        kept.append(attribute.strip())
    if path is not None:
        if not keeps_prefix and path.startswith("/"):
            path = base + path if path != "/" else base
        if path != base and not path.startswith(base + "/"):
            path = base
        kept.append(f"Path={path}")
    return "; ".join(kept).encode("latin-1")


def to_program(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The browser's headers the program may see (its cookies go through request_cookies)."""
    return [
        (name, value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP and name.lower() not in PLATFORM_REQUEST
    ]


def to_browser(
    headers: Iterable[tuple[bytes, bytes]], prefix: str, *, keeps_prefix: bool
) -> list[tuple[bytes, bytes]]:
    """The program's response headers the browser may see, with its redirects and cookies kept
    under the session's path."""
    kept: list[tuple[bytes, bytes]] = []
    for raw_name, raw_value in headers:
        name, value = bytes(raw_name).lower(), bytes(raw_value)
        if name in REFUSED_RESPONSE or (name in HOP_BY_HOP and name != b"content-length"):
            continue
        if name == b"set-cookie":
            cookie = set_cookie(value, prefix, keeps_prefix=keeps_prefix)
            if cookie is None:
                continue
            value = cookie
        elif name == b"location" and not keeps_prefix:
            # A program served at its root names its own paths; put them under the session's.
            if value.startswith(b"/") and not value.startswith(b"//"):
                value = prefix.encode() + value[1:]
        kept.append((name, value))
    return kept
