"""The app's own routes: health, sign-in (page and API), the route every task is delivered to."""
from flask import Blueprint, Response, current_app, flash, jsonify, redirect, render_template, request
from flask.typing import ResponseReturnValue
from google.cloud import ndb

from core import identity, runtime, tasks
from core.errors import AppError, Forbidden, NotFound
from core.web import json_body

bp = Blueprint("core", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """Datastore and cache reachability; 503 only when Datastore is down (the cache is optional)."""
    cache = runtime.cache()
    cache_state = {"backend": cache.backend, "status": cache.ping()}
    if not _datastore_answers():
        return jsonify(datastore="down", cache=cache_state), 503
    return jsonify(datastore="ok", cache=cache_state)


def _datastore_answers() -> bool:
    """A lookup by key that bypasses both caches: whether Datastore itself answers."""
    try:
        ndb.Key("Healthz", "ping").get(use_cache=False, use_global_cache=False, timeout=3, retries=0)
    except Exception:  # noqa: BLE001 - whatever the failure, Datastore did not answer this lookup
        return False
    return True


@bp.get("/_ah/warmup")
def warmup() -> ResponseReturnValue:
    """App Engine's warmup request (app.yaml: inbound_services: warmup), sent to a new instance before it takes
    traffic. The process that answers it was built at import and opens its Datastore channel here with one lookup
    by key (the instance's other gunicorn worker opens its own on its first request). It answers 200 even if that
    lookup fails: the instance serves anyway."""
    _datastore_answers()
    return "", 200


@bp.get("/api/openapi.json")
def openapi_document() -> ResponseReturnValue:
    """The OpenAPI 3.1 document of the JSON API (core/openapi.py)."""
    return jsonify(current_app.extensions["openapi"])


@bp.route("/signin", methods=("GET", "POST"))
def signin() -> ResponseReturnValue:
    """The local dev sign-in form (on App Engine, IAP signs people in; elsewhere it does not exist)."""
    identity.require_dev_signin()
    if request.method == "POST":
        try:
            identity.dev_sign_in(request.form.get("email", "").strip(), request.form.get("admin") == "on")
        except AppError as e:
            if e.status == 404:
                raise
            flash(e.message, "error")
            return render_template("core/signin.html"), e.status
        return redirect(_safe_next(request.form.get("next")))
    return render_template("core/signin.html")


@bp.post("/signout")
def signout() -> ResponseReturnValue:
    """Forget the dev sign-in."""
    identity.sign_out()
    return redirect("/")


def _safe_next(target: str | None) -> str:
    """Only a path on this site: an open redirect would turn sign-in into a phishing aid. No whitespace or control
    character anywhere: werkzeug drops a tab from a Location header, so "/\t/evil.example" would leave as
    "//evil.example", another host."""
    if (target and target.startswith("/") and not target.startswith("//") and "\\" not in target
            and not any(c.isspace() or not c.isprintable() for c in target)):
        return target
    return "/"


@bp.get("/api/session")
def get_session() -> ResponseReturnValue:
    """Who is signed in."""
    return jsonify(user=identity.require_user())


@bp.post("/api/session")
def create_session() -> ResponseReturnValue:
    """Dev sign-in: {"email", "admin"}."""
    data = json_body()
    return jsonify(user=identity.dev_sign_in(data.get("email"), data.get("admin", False)))


@bp.delete("/api/session")
def delete_session() -> ResponseReturnValue:
    """Sign out."""
    identity.sign_out()
    return "", 204


@bp.post("/api/tasks/<name>")
def run_task(name: str) -> ResponseReturnValue:
    """A queued task's delivery (core/tasks.py): only a queue of this app may call it. A 2xx ends the task; anything
    else makes the queue deliver it again later."""
    if not tasks.is_from_queue(request.headers, runtime.current().settings):
        raise Forbidden("Only the app's task queue may call this.", "not_from_queue")
    fn = runtime.tasks().handler(name)
    if fn is None:
        raise NotFound(f"No task handler is named {name!r}.", "no_such_task")
    attempt = request.headers.get(tasks.RETRY_HEADER, "0")
    result = fn(json_body(), int(attempt) if attempt.isdigit() else 0)
    return jsonify(result or {})


# The answers that mean "this task, again later" rather than "the app is overloaded" (core/errors.py, core/web.py).
RETRY_THIS_TASK = {"unavailable", "index_not_ready"}


@bp.after_app_request
def _retry_without_throttling(response: Response) -> Response:
    """A task that met contention, or an index still building, answers 503 as any request would. Cloud Tasks reads a
    503 from an App Engine target as an overloaded target and slows the whole queue
    (https://cloud.google.com/tasks/docs/common-pitfalls), so these become a 500, which it retries on the queue's
    backoff. Datastore or the cache away stays a 503: then slowing the queue is what helps."""
    if request.endpoint == f"{bp.name}.run_task" and response.status_code == 503:
        error = (response.get_json(silent=True) or {}).get("error", {})
        if error.get("code") in RETRY_THIS_TASK:
            response.status_code = 500
            response.headers.pop("Retry-After", None)
    return response
