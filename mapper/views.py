"""Jobs: the /jobs pages (start a job, watch its progress) and the /api/jobs routes."""
import json
import zlib
from typing import Any

from flask import Blueprint, flash, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from core import idempotency, identity, runtime, tasks, validate
from core.errors import AppError, Conflict, Forbidden
from core.web import form_refused, json_body
from mapper import jobs as job_definitions
from mapper import service, sweep

bp = Blueprint("mapper", __name__)
CRON_HEADER = "X-Appengine-Cron"


@bp.get("/jobs")
def jobs(status: int = 200) -> ResponseReturnValue:
    """Recent jobs with their state, and (admins) a form per registered job (`status`: a refused form's)."""
    recent = [service.job_dict(job) for job in service.list_jobs()]
    return render_template("mapper/jobs.html", jobs=recent, registered=job_definitions.registered(),
                           max_page_size=service.MAX_PAGE_SIZE), status


@bp.post("/jobs")
def start_form() -> ResponseReturnValue:
    """Start a job from its form; the form's token makes a resend of it answer the first job."""
    user = identity.require_admin()
    name = request.form.get("name", "")
    definition = job_definitions.registered().get(name)
    params = {field: validate.form_number(request.form.get(field))
              for field, _, _ in (definition.fields if definition else ())}
    try:
        job = service.start_job(name, params, idempotency_key=request.form.get("start_token") or None,
                                user=user["id"])
    except AppError as e:
        return form_refused(e, jobs)
    return redirect(url_for("mapper.job", job_id=job.id))


@bp.get("/jobs/<job_id>")
def job(job_id: str) -> ResponseReturnValue:
    """One job: a progress bar that follows the job live, its processed count, tasks, tree depth and time."""
    job = service.get_job(job_id)
    return render_template("mapper/job.html", job=service.job_dict(job),
                           definition=job_definitions.registered().get(job.name))


# A job's timeline reads one record per task drawn, and anyone may ask for it: so it is cached. A finished job's never
# changes: kept a week (a key with no expiry is never evicted under Redis's volatile-* policies). A running one's for
# a poll's worth, so many viewers cost one reading of its records per lifetime.
TIMELINE_FINISHED_LIFETIME = 7 * 24 * 3600
TIMELINE_RUNNING_LIFETIME = 5


def _timeline(job_id: str) -> dict[str, Any]:
    """service.job_timeline, from the cache when a copy is there (one round trip, no Datastore read at all)."""
    cache, key = runtime.cache(), f"job-timeline:{job_id}"
    cached = cache.get(key) if service.JOB_ID_PATTERN.fullmatch(job_id) else None
    if cached is not None:
        found: dict[str, Any] = json.loads(zlib.decompress(cached))
        return found
    job = service.get_job(job_id)  # 400 for a malformed id, 404 for no such job
    found = service.job_timeline(job)
    # `add`: a running copy cached meanwhile expires in seconds; an ended job's copy is the same whoever made it.
    cache.add(key, zlib.compress(json.dumps(found).encode()),
              expire=TIMELINE_FINISHED_LIFETIME if job.ended else TIMELINE_RUNNING_LIFETIME)
    return found


@bp.get("/jobs/<job_id>/timeline")
def timeline(job_id: str) -> ResponseReturnValue:
    """A job's tasks drawn as a timeline: when each ran, its depth in the tree, the critical path marked."""
    found = _timeline(job_id)
    rows = [{"label": task["task"] + (" (swept)" if task["revived"] else ""), "start": task["start_s"],
             "end": task["end_s"], "kind": "task", "critical": task["critical"],
             "detail": f"depth {task['depth']}, {task['processed']} processed, {task['state']}"
                       + (f", taken up again by the sweep {task['revived']}x" if task["revived"] else "")}
            for task in found["tasks"]]
    return render_template("mapper/timeline.html", job=found["job"], rows=rows, cut=found["cut"],
                           most_tasks=found["most_tasks"], total=max([row["end"] for row in rows], default=0))


@bp.post("/jobs/<job_id>/finish")
def finish_form(job_id: str) -> ResponseReturnValue:
    """Finish a job whose tasks have all reported back."""
    identity.require_admin()
    try:
        service.finish_job(job_id)
    except Conflict as e:
        flash(e.message, "error")
    return redirect(url_for("mapper.job", job_id=job_id))


@bp.post("/jobs/<job_id>/cancel")
def cancel_form(job_id: str) -> ResponseReturnValue:
    """Cancel a running job."""
    identity.require_admin()
    service.cancel_job(job_id)
    return redirect(url_for("mapper.job", job_id=job_id))


@bp.post("/api/jobs")
def api_start() -> ResponseReturnValue:
    """Start a registered job: {"name", "params", "page_size"?, "fanout"?} -> 202; a resend with the same
    Idempotency-Key answers the first one's job (the key sent for another job: 409)."""
    user = identity.require_admin()
    data = json_body()
    job, replayed = service.start(data.get("name"), data.get("params"), data.get("page_size"), data.get("fanout"),
                                  request.headers.get("Idempotency-Key"), user["id"])
    return idempotency.marked(jsonify(service.job_dict(job)), replayed), 202


@bp.get("/api/jobs/sweep")
def api_sweep() -> ResponseReturnValue:
    """The sweep, for the app's scheduler only: App Engine cron sends a GET, its only method, with X-Appengine-Cron, a
    header App Engine strips from outside requests
    (https://cloud.google.com/appengine/docs/standard/scheduling-jobs-with-cron-yaml#securing_urls_for_cron); the
    local task server sends the app's task token. So this GET writes; anyone else gets a 403."""
    settings = runtime.current().settings
    if not (request.headers.get(CRON_HEADER) == "true" if settings.on_app_engine
            else tasks.is_from_queue(request.headers, settings)):
        raise Forbidden("Only the app's scheduler may call this.", "not_from_cron")
    return jsonify(sweep.sweep())


@bp.get("/api/jobs")
def api_list() -> ResponseReturnValue:
    """Recent jobs, newest first."""
    return jsonify(jobs=[service.job_dict(job) for job in service.list_jobs()])


@bp.get("/api/jobs/<job_id>")
def api_get(job_id: str) -> ResponseReturnValue:
    """A job's state, processed count, progress (0..1), tasks and tree depth."""
    return jsonify(service.job_dict(service.get_job(job_id)))


@bp.get("/api/jobs/<job_id>/timeline")
def api_timeline(job_id: str) -> ResponseReturnValue:
    """A job's tasks, each from when it began to its last commit, with the critical path marked."""
    return jsonify(_timeline(job_id))


@bp.post("/api/jobs/<job_id>/finish")
def api_finish(job_id: str) -> ResponseReturnValue:
    """Finish a job whose tasks have all reported back (409 while ranges are still out)."""
    identity.require_admin()
    return jsonify(service.job_dict(service.finish_job(job_id)))


@bp.post("/api/jobs/<job_id>/cancel")
def api_cancel(job_id: str) -> ResponseReturnValue:
    """Cancel a running job."""
    identity.require_admin()
    return jsonify(service.job_dict(service.cancel_job(job_id)))
