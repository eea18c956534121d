"""Who may see the dashboard, who may act, and the headers every answer carries.

- Authentication: an optional hook the host application passes, and an optional
  built-in HTTP basic auth (constant-time comparison). /health needs neither.
- CSRF: every POST carries the session's token (form field or X-CSRF-Token
  header) and, when the browser sends one, an Origin of this host; a basic-auth
  deployment needs this too, since browsers resend credentials on their own.
- Headers: a Content-Security-Policy that allows no inline script, no framing.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

from flask import Request, Response, abort, session
from werkzeug.datastructures import WWWAuthenticate
from werkzeug.wrappers import Response as BaseResponse

# What an auth hook returns: True or "operate" lets the request through, "read"
# lets it through without actions, False or None refuses it (403); a Response is
# sent as it is (a redirect to the host's login page, say).
Access = bool | Literal["read", "operate"] | None | BaseResponse
AuthHook = Callable[[Request], Access]

# The host names to trust when serving without auth on loopback: a web page that
# rebinds its own name to 127.0.0.1 then gets nothing from the dashboard.
LOOPBACK_NAMES = ["localhost", "127.0.0.1", "[::1]"]

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
_SESSION_KEY = "treadle_csrf"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)


def check_basic_auth(request: Request, username: str, password: str) -> Response | None:
    """None when the request carries these credentials; otherwise a 401 challenge."""
    given = request.authorization
    if given is not None and given.type == "basic":
        user_ok = hmac.compare_digest((given.username or "").encode(), username.encode())
        password_ok = hmac.compare_digest((given.password or "").encode(), password.encode())
        if user_ok and password_ok:
            return None
    response = Response("Authentication required.\n", status=401, mimetype="text/plain")
    response.www_authenticate = WWWAuthenticate("basic", {"realm": "treadle", "charset": "UTF-8"})
    return response


def host_name(host: str) -> str:
    """The name in a Host header, without its port: 'localhost', '127.0.0.1', '[::1]'."""
    if host.startswith("["):
        return host[: host.find("]") + 1].lower()
    return host.rsplit(":", 1)[0].lower() if host.count(":") == 1 else host.lower()


def csrf_token() -> str:
    """The session's CSRF token, made on first use."""
    token = session.get(_SESSION_KEY)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session[_SESSION_KEY] = token
    return token


def check_csrf(request: Request) -> None:
    """Abort with 400 unless a POST carries the session's token and comes from this host."""
    origin = request.headers.get("Origin")
    # the host alone: a proxy that ends TLS makes the schemes differ
    if origin is not None and urlsplit(origin).netloc != request.host:
        abort(400, description="This request came from another site, so it was refused.")
    expected = session.get(_SESSION_KEY)
    given = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
    if not isinstance(expected, str) or not hmac.compare_digest(given.encode(), expected.encode()):
        abort(400, description="The form's CSRF token is missing or wrong: reload the page and try again.")


def add_security_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    if "Cache-Control" not in response.headers:
        response.headers["Cache-Control"] = "no-store"
    return response
