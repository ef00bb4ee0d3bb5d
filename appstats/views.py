"""Admins: what the last requests of every process cost (Datastore RPCs and cache calls by method, time), and each
one's timeline: every call a bar from its start to its answer, as Appstats drew them. The records are in the shared
cache (records.py), so any process answers for any request."""
from typing import Any

from flask import Blueprint, jsonify, render_template, url_for
from flask.typing import ResponseReturnValue

from appstats import records
from core import billing, costs, identity, runtime
from core.errors import AppError, NotFound, Unavailable

bp = Blueprint("appstats", __name__)

AWAY = ("The cache is not answering (or none is set up): Appstats keeps its records there, shared by every process, "
        "so none can be read now. Requests are served and counted all the same (each answer's Server-Timing header, "
        "each page's footer, the log lines).")


def _recent() -> list[dict[str, Any]]:
    try:
        return records.recent(runtime.current().cache)
    except records.Away:
        raise Unavailable(AWAY, "cache_away") from None


def _timeline(request_id: int) -> dict[str, Any]:
    """The request's record with its timeline; a 404 that says why once it is no longer kept."""
    try:
        record, calls = records.find(runtime.current().cache, request_id)
    except records.Away:
        raise Unavailable(AWAY, "cache_away") from None
    except records.Gone as gone:
        if gone.recorded:
            raise NotFound(
                f"Request {request_id} is no longer kept: Appstats keeps the last {records.RING} requests of every "
                f"process in the cache, each for {records.KEPT_SECONDS // 3600} hours at most, and this one has "
                "expired, was evicted by the cache, or was written over by a newer request.",
                "request_expired") from None
        raise NotFound(f"No request has been given the id {request_id}.", "no_such_request") from None
    counted = record["datastore"]["rpcs"] + record["cache"]["calls"]
    return {"request": record, **costs.timeline(calls, counted), "most_calls": costs.MOST_CALLS}


def _signin_url() -> str:
    return url_for("core.signin", next=url_for("appstats.index"))


@bp.get("/appstats")
def index() -> ResponseReturnValue:
    """The last requests' costs of every process, newest first. Anyone else gets the page without the list (it says
    who asked for what), with the refusal's status and what to do (a visitor: the sign-in, back here after)."""
    shown = {"size": records.LISTED, "billing": billing, "signin": _signin_url()}
    try:
        identity.require_admin()
        requests = _recent()
    except AppError as e:
        return render_template("appstats/index.html", requests=None, refused=e, **shown), e.status
    return render_template("appstats/index.html", requests=requests, refused=None, **shown)


@bp.get("/appstats/<int:request_id>")
def timeline(request_id: int) -> ResponseReturnValue:
    """One request's timeline (admins: it says who asked for what)."""
    identity.require_admin()
    found = _timeline(request_id)  # one no longer kept: the error page says so (404 request_expired)
    rows = [{"label": call["name"], "start": call["start_ms"], "end": call["end_ms"], "kind": call["kind"],
             "critical": call["critical"], "detail": f"{call['end_ms'] - call['start_ms']:.2f} ms"}
            for call in found["calls"]]
    record = found["request"]
    bill = billing.Billed(**{k: record["billed"][k] for k in ("reads", "writes", "deletes", "small")})
    return render_template("appstats/timeline.html", r=record, rows=rows, cut=found["cut"],
                           most_calls=found["most_calls"], bill=bill.priced(" such requests"),
                           total=max([record["app_ms"], *(row["end"] for row in rows)]))


@bp.get("/api/appstats")
def api_recent() -> ResponseReturnValue:
    """Admin: the last requests' costs of every process, newest first."""
    identity.require_admin()
    return jsonify(requests=_recent(), size=records.LISTED)


@bp.get("/api/appstats/<int:request_id>")
def api_timeline(request_id: int) -> ResponseReturnValue:
    """Admin: one recent request's costs and its calls' times."""
    identity.require_admin()
    return jsonify(_timeline(request_id))
