"""The app's own routes: health, warmup, sign-in (page and API), the route every task is delivered to."""
import time
from typing import Any

from flask import Blueprint, Response, current_app, flash, jsonify, redirect, render_template, request
from flask.typing import ResponseReturnValue
from google.cloud import ndb

from core import identity, runtime, tasks, web
from core.errors import AppError, Forbidden, NotFound
from core.web import json_body

bp = Blueprint("core", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """Datastore and cache reachability; 503 only when Datastore is down (the cache is optional)."""
    cache = runtime.cache()
    cache_state = {"backend": cache.backend, "status": cache.ping()}
    up = _datastore_answers()
    return jsonify(datastore="ok" if up else "down", cache=cache_state), 200 if up else 503


def _datastore_answers() -> bool:
    """A lookup by key that bypasses both caches: whether Datastore itself answers."""
    try:
        ndb.Key("Healthz", "ping").get(use_cache=False, use_global_cache=False, timeout=3, retries=0)
    except Exception:  # noqa: BLE001 - whatever the failure, Datastore did not answer this lookup
        return False
    return True


@bp.get("/_ah/warmup")
def warmup() -> ResponseReturnValue:
    """App Engine's warmup request (app.yaml: inbound_services: warmup): 200 even if the lookup fails."""
    _warm_up()
    return "", 200


def warm(app: Any) -> str:
    """What a new process does before its first request (one Datastore lookup, one cache call), said in one line for
    the log. Each gunicorn worker runs it at start, because App Engine's warmup request reaches one worker of an
    instance at most, and does "not work in every case"
    (https://cloud.google.com/appengine/docs/standard/configuring-warmup-requests). Never raises."""
    started = time.perf_counter()
    with runtime.of(app).context():
        said = _warm_up()
    return f"{said} in {(time.perf_counter() - started) * 1000:.0f} ms"


def _warm_up() -> str:
    datastore = "ok" if _datastore_answers() else "down"
    return f"Datastore {datastore}, cache {runtime.cache().ping()}"


@bp.get("/api/openapi.json")
def openapi_document() -> ResponseReturnValue:
    return jsonify(current_app.extensions["openapi"])


# Google's button is a script and an iframe from accounts.google.com: allowed on this page only
# (https://developers.google.com/identity/gsi/web/guides/get-google-api-clientid#content_security_policy).
GOOGLE_SIGNIN_CSP = {**web.CONTENT_SECURITY_POLICY,
                     "script-src": "'self' https://accounts.google.com/gsi/client",
                     "frame-src": "https://accounts.google.com/gsi/",
                     "connect-src": "'self' https://accounts.google.com/gsi/",
                     "style-src": "'self' https://accounts.google.com/gsi/style"}


@bp.route("/signin", methods=("GET", "POST"))
@web.with_csp(GOOGLE_SIGNIN_CSP)
def signin() -> ResponseReturnValue:
    """Sign in: with Google where GOOGLE_CLIENT_ID is set (App Engine), with the dev form in local development."""
    if not runtime.current().settings.sign_in_offered:
        raise NotFound("Nobody signs in here: set GOOGLE_CLIENT_ID, or DEV_SIGNIN=on in local development.")
    if request.method == "POST":
        try:
            if "credential" in request.form:  # posted by static/signin.js with the token Google's button gave
                identity.google_sign_in(request.form["credential"], current_app.extensions["google_keys"])
            else:
                identity.dev_sign_in(request.form.get("email", "").strip(), request.form.get("admin") == "on")
        except AppError as e:
            if e.status in (404, 503):
                raise
            flash(e.message, "error")
            return _signin_page(), e.status
        return redirect(_safe_next(request.form.get("next")))
    return _signin_page()


def _signin_page() -> str:
    settings = runtime.current().settings
    return render_template("core/signin.html", google_client_id=settings.google_client_id,
                           dev_signin=settings.dev_signin)


@bp.post("/signout")
def signout() -> ResponseReturnValue:
    identity.sign_out()
    return redirect("/")


def _safe_next(target: str | None) -> str:
    """Only a path on this site (an open redirect would make sign-in a phishing aid), with no whitespace or control
    character: werkzeug drops a tab from a Location header, so "/\t/evil.example" would leave as "//evil.example"."""
    if (target and target.startswith("/") and not target.startswith("//") and "\\" not in target
            and not any(c.isspace() or not c.isprintable() for c in target)):
        return target
    return "/"


@bp.get("/api/session")
def get_session() -> ResponseReturnValue:
    return jsonify(user=identity.require_user())


@bp.post("/api/session")
def create_session() -> ResponseReturnValue:
    """Sign in: {"credential"} (a Google ID token, where GOOGLE_CLIENT_ID is set), or the dev sign-in's
    {"email", "admin"}."""
    data = json_body()
    if "credential" in data:
        return jsonify(user=identity.google_sign_in(data["credential"], current_app.extensions["google_keys"]))
    return jsonify(user=identity.dev_sign_in(data.get("email"), data.get("admin", False)))


@bp.delete("/api/session")
def delete_session() -> ResponseReturnValue:
    identity.sign_out()
    return "", 204


@bp.post("/api/tasks/<name>")
@web.body_limit(tasks.MAX_TASK_BYTES)
def run_task(name: str) -> ResponseReturnValue:
    """A queued task's delivery (core/tasks.py): only a queue of this app may call it. A 2xx ends the task; anything
    else makes the queue deliver it again later."""
    if not tasks.is_from_queue(request.headers, runtime.current().settings):
        raise Forbidden("Only the app's task queue may call this.", "not_from_queue")
    fn = runtime.tasks().handler(name)
    if fn is None:
        raise NotFound(f"No task handler is named {name!r}.", "no_such_task")
    runtime.tasks().delivered()
    attempt = request.headers.get(tasks.RETRY_HEADER, "0")
    result = fn(json_body(), int(attempt) if attempt.isdigit() else 0)
    return jsonify(result or {})


# The answers that mean "this task, again later" rather than "the app is overloaded" (core/errors.py, core/web.py).
RETRY_THIS_TASK = {"unavailable", "index_not_ready"}


@bp.after_app_request
def _retry_without_throttling(response: Response) -> Response:
    """A task that met contention, or an index still building, answers 500, not 503: Cloud Tasks reads a 503 as an
    overloaded target and slows the whole queue (https://cloud.google.com/tasks/docs/common-pitfalls). Datastore or
    the cache away stays a 503: then slowing the queue is what helps."""
    if request.endpoint == f"{bp.name}.run_task" and response.status_code == 503:
        error = (response.get_json(silent=True) or {}).get("error", {})
        if error.get("code") in RETRY_THIS_TASK:
            response.status_code = 500
            response.headers.pop("Retry-After", None)
    return response
