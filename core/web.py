"""HTTP plumbing shared by every blueprint: JSON bodies, the API's error shape, error pages, CSRF for forms."""
import logging
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, current_app, flash, jsonify, make_response, render_template, request, url_for
from flask.globals import request_ctx
from flask.typing import ResponseReturnValue
from flask_talisman import Talisman
from flask_wtf.csrf import CSRFError, CSRFProtect
from google.api_core import exceptions as core_exceptions
from markupsafe import Markup, escape
from werkzeug.exceptions import BadHost, HTTPException, RequestEntityTooLarge, SecurityError

from core import clock, features, identity, runtime, validate
from core.cache import CACHE_DOWN
from core.errors import AppError, BadInput

log = logging.getLogger(__name__)
csrf = CSRFProtect()
# Every page's scripts and styles are files under /static: no inline script or style, no event-handler attributes,
# nothing from another origin. So a comment or title that slipped past escaping still could not run.
CONTENT_SECURITY_POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",  # data: for the empty favicon (no favicon request)
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
DATASTORE_DOWN = (core_exceptions.ServiceUnavailable, core_exceptions.DeadlineExceeded, core_exceptions.RetryError)


def _not_json() -> AppError:
    return AppError("Send the body as JSON with Content-Type: application/json.", "unsupported_media_type", 415)


def is_api() -> bool:
    return request.path == "/api" or request.path.startswith("/api/")


# What a request's body may hold, refused with a 413 before a byte of it is parsed: anyone may send a body, and a large
# one costs a worker's CPU to parse and walk before any route looks at it. Routes that take long text say `body_limit`.
BODY_BYTES = 8 * 1024


def text_body_bytes(*most_characters: int) -> int:
    """The largest body that carries text fields of these most characters, with room for the rest: 12 bytes a
    character at worst (JSON's surrogate-pair escape "\\ud83d\\ude00", or a form's "%F0%9F%98%80")."""
    return 12 * sum(most_characters) + 1024


def body_limit(max_bytes: int) -> Callable[[Callable], Callable]:
    """A view decorator (put it next to the `def`): this route takes bodies of up to `max_bytes`, not BODY_BYTES."""
    def mark(view: Callable) -> Callable:
        view.body_limit = max_bytes  # type: ignore[attr-defined]
        return view
    return mark


def _limit_body() -> None:
    """The matched route's body limit: a larger Content-Length is a 413 at once. A body sent without one (chunked) is
    read here, one byte past the limit at most: werkzeug's stream stops at the limit without a word, and the route
    would parse the cut body."""
    view = current_app.view_functions.get(request.endpoint or "")
    limit = getattr(view, "body_limit", BODY_BYTES)
    request.max_form_memory_size = limit  # an entry form's body field may then fill it (Flask's default: 500 KB)
    if request.content_length is None and request.method in UNSAFE:
        request.max_content_length = limit + 1
        if len(request.get_data(cache=True)) > limit:  # kept: the JSON and form parsers read the cached bytes
            raise RequestEntityTooLarge()
    request.max_content_length = limit
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()


def json_body() -> dict:
    """The request's JSON object; 415 without the JSON content type, 400 when it does not parse to an object, 422 when
    a string in it holds what no text field may (validate.plain_json)."""
    if not request.is_json:
        raise _not_json()
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # nesting deeper than Python's parser goes: not a body any route takes
        data = None
    if not isinstance(data, dict):
        raise BadInput("The body must be a JSON object.", "bad_json")
    return validate.plain_json(data)


def error_response(status: int, code: str, message: str) -> ResponseReturnValue:
    if is_api():
        return jsonify(error={"code": code, "message": message}), status
    _bind_urls()
    return render_template("error.html", status=status, message=message, back=_same_site_referrer()), status


def _bind_urls() -> None:
    """Lets the error page build its links for a Host refused before routing (untrusted, or not a name), on the app's
    own name, never on the refused one."""
    if request_ctx.url_adapter is None:
        request_ctx.url_adapter = current_app.url_map.bind(
            runtime.current().settings.canonical_host, script_name=request.script_root or None,
            url_scheme=request.scheme)


def _same_site_referrer() -> str | None:
    """The page the visitor came from, when it is one of this site's (the error page's "Go back")."""
    try:
        host_url = request.host_url  # the refused Host again, for a request refused for it
    except SecurityError:
        return None
    referrer = request.referrer
    return referrer if referrer and referrer.startswith(host_url) else None


def canonical_url(endpoint: str, **values: Any) -> str:
    """The page's URL on the app's own name, whatever Host the request came with (for Atom ids, which must not move)."""
    return runtime.current().settings.canonical_url_root + url_for(endpoint, **values)


def _cross_site() -> bool:
    """Whether a browser sent this request for another site's page. Browsers say so themselves: Sec-Fetch-Site on
    every request to a secure origin, HTTPS or localhost (https://www.w3.org/TR/fetch-metadata/), and Origin on every
    request whose method is not GET or HEAD (https://fetch.spec.whatwg.org/#origin-header), a `fetch(..., {mode:
    "no-cors"})` and a `sendBeacon` included; a page's script can set neither (forbidden request headers). A client
    that sends neither (curl, a script, Cloud Tasks) carries no visitor's cookies but its own."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site not in ("same-origin", "none")  # "none": typed or bookmarked by the user
    origin = request.headers.get("Origin")
    return origin is not None and urlsplit(origin).netloc != request.host  # "null" (a sandboxed page) too


def _check_unsafe_request() -> None:
    """Forms need a CSRF token. The API needs none: a request another site's page makes a browser send is refused
    (403) by what the browser says of it (`_cross_site`), even a bodyless one; a body a form can send has a non-JSON
    Content-Type (415); a JSON one needs a CORS preflight that this app never grants."""
    if request.method not in UNSAFE:
        return
    if is_api():
        if _cross_site():
            raise AppError("Requests from another site's pages are refused.", "cross_site", 403)
        if request.content_type and not request.is_json:
            raise _not_json()
    else:
        csrf.protect()


def form_refused(error: AppError, rerender: Callable[[int], ResponseReturnValue]) -> ResponseReturnValue:
    """A form view's answer to the service's refusal of its input (400/422): the reason flashed and the form's page
    again, `rerender(status)` showing what was typed. Any other error is raised again, to its usual handler."""
    if error.status not in (400, 422):
        raise error
    flash(error.message, "error")
    return rerender(error.status)


def when(iso: str) -> str:
    """"2026-11-21T10:30:00Z" as "21 Nov 2026, 10:30 UTC" (times are stored and cached as ISO 8601 UTC)."""
    try:
        return clock.parse_iso(iso).strftime("%-d %b %Y, %H:%M UTC")
    except (TypeError, ValueError):
        return iso


def code_spans(text: str) -> Markup:
    """Text written for the README too, where `x` is code: escaped, with each `x` as <code>x</code>."""
    parts = str(escape(text)).split("`")
    return Markup("".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts)))


def new_form_token() -> str:
    """A fresh token for a form's hidden idempotency field: a resend of the same form is then a no-op."""
    return uuid.uuid4().hex


def _page_globals() -> dict[str, Any]:
    return {"current_user": identity.current_user(), "settings": runtime.current().settings,
            "nav": features.of(current_app).navigation}


def with_csp(policy: dict[str, str]) -> Callable[[Callable], Callable]:
    """A view decorator: this view's Content-Security-Policy instead of the app's (Talisman's per-view options)."""
    return Talisman()(content_security_policy=policy)


def init_app(app: Flask) -> None:
    """The plumbing every page and route shares; core's own routes are core.views.bp."""
    csrf.init_app(app)
    # Another Host is a 400 (`bad_host`) before any view runs: a local app is reached only by its loopback names, so
    # another site's page cannot rebind its own name to 127.0.0.1 and act as same-origin (Settings.trusted_hosts).
    app.config["TRUSTED_HOSTS"] = list(runtime.of(app).settings.trusted_hosts) or None
    on_app_engine = runtime.of(app).settings.on_app_engine
    # Security headers on every response. HSTS only on App Engine, where app.yaml's `secure: always` redirects (the app
    # never does: a Cloud Tasks delivery must not be bounced); locally HSTS would pin the browser to HTTPS for
    # 127.0.0.1. One Talisman per app: it keeps its options on itself, and a process may build several apps.
    app.extensions["talisman"] = Talisman(
        app, force_https=False, frame_options="DENY", content_security_policy=CONTENT_SECURITY_POLICY,
        referrer_policy="strict-origin-when-cross-origin", strict_transport_security=on_app_engine,
        session_cookie_secure=on_app_engine)
    app.add_template_filter(when)
    app.add_template_filter(code_spans)
    app.add_template_global(new_form_token)
    app.add_template_global(canonical_url)
    app.context_processor(_page_globals)
    app.before_request(_limit_body)  # first: the CSRF check below reads a form's body
    app.before_request(_check_unsafe_request)

    @app.errorhandler(AppError)
    def app_error(e: AppError) -> ResponseReturnValue:
        response = make_response(error_response(e.status, e.code, e.message))
        if e.retry_after is not None:
            response.headers["Retry-After"] = str(e.retry_after)
        return response

    @app.errorhandler(CSRFError)
    def csrf_error(e: CSRFError) -> ResponseReturnValue:
        return error_response(400, "csrf",
                              "The form was out of date or not from this site; reload the page and try again.")

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> ResponseReturnValue:
        if isinstance(e, SecurityError | BadHost):
            return error_response(400, "bad_host", "This site does not answer to that host name.")
        code = (e.name or "error").lower().replace(" ", "_")
        messages = {404: "There is nothing here.", 405: "That method is not allowed here.",
                    413: "The request body is too large."}
        status = e.code or 500
        return error_response(status, code, messages.get(status, e.description or e.name))

    def datastore_down(e: Exception) -> ResponseReturnValue:
        log.error("Datastore unavailable: %s", e)
        return error_response(503, "datastore_unavailable", "The datastore is not answering; try again shortly.")
    for datastore_error in DATASTORE_DOWN:
        app.register_error_handler(datastore_error, datastore_down)

    @app.errorhandler(core_exceptions.InvalidArgument)
    def datastore_refused(e: core_exceptions.InvalidArgument) -> ResponseReturnValue:
        # A key name Datastore reserves (__...__) comes from what a caller sent: validate.not_reserved refuses such
        # names first, naming the field; one it missed is logged as the bug it is, and the caller gets a 400 for input
        # nothing wrote. Any other InvalidArgument is the app's own mistake (a transaction over too many entity
        # groups, say): a 500, which alerting sees.
        if "reserved" not in str(e).lower():
            return unexpected(e)
        log.error("Datastore refused a reserved name on %s %s: %s", request.method, request.path, e)
        return error_response(400, "invalid_argument", "Datastore refused a name in this request as reserved.")

    def cache_down(e: Exception) -> ResponseReturnValue:
        # a write of a cached kind, refused before Datastore was touched (strict_write: core/cache.py)
        log.error("cache (%s) unreachable during a write: %r", runtime.current().cache.backend, e)
        return error_response(503, "cache_unavailable",
                              "This change cannot be saved while the cache is unreachable; try again shortly.")
    for cache_error in CACHE_DOWN:
        app.register_error_handler(cache_error, cache_down)

    @app.errorhandler(Exception)
    def unexpected(e: Exception) -> ResponseReturnValue:
        log.exception("Unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal", "Something went wrong on our side; it has been logged.")

    @app.errorhandler(core_exceptions.FailedPrecondition)
    def index_not_ready(e: core_exceptions.FailedPrecondition) -> ResponseReturnValue:
        # A query whose composite index is missing or still building (for minutes after a first deploy) fails with
        # FailedPrecondition, with no reason code: the message tells it from another failed precondition (a 500).
        if "index" not in str(e).lower():
            return unexpected(e)
        log.error("a query's index is building or missing: %s", e)
        response = make_response(error_response(
            503, "index_not_ready", "This page needs a Datastore index that is not ready yet; try again in a minute."))
        response.headers["Retry-After"] = "60"
        return response
