"""Admins: what the last requests served by this process cost (Datastore RPCs and cache calls by method, time), and
each one's timeline: every call a bar from its start to its answer, as Appstats drew them."""
from typing import Any

from flask import Blueprint, current_app, jsonify, render_template
from flask.typing import ResponseReturnValue

from appstats.accounting import RECENT
from core import billing, costs, identity
from core.errors import AppError, NotFound

bp = Blueprint("appstats", __name__)


def _recent() -> list[dict[str, Any]]:
    return [record for record, _ in list(current_app.extensions["appstats"])]


def _timeline(request_id: int) -> dict[str, Any]:
    """The request's record with its timeline; 404 once it is no longer among the recent ones of this process."""
    for record, cost in list(current_app.extensions["appstats"]):
        if record["id"] == request_id:
            counted = record["datastore"]["rpcs"] + record["cache"]["calls"]
            return {"request": record, **cost.timeline(counted), "most_calls": costs.MOST_CALLS}
    raise NotFound(f"Request {request_id} is not among this process's last {RECENT}: each gunicorn worker keeps its "
                   f"own, and older ones are gone.", "no_such_request")


@bp.get("/appstats")
def index() -> ResponseReturnValue:
    """The last requests' costs, newest first (this process only: each gunicorn worker keeps its own). Anyone else
    gets the page without the list (it says who asked for what), with the refusal's status and what to do."""
    try:
        identity.require_admin()
    except AppError as e:
        return render_template("appstats/index.html", requests=None, refused=e.message, size=RECENT,
                               billing=billing), e.status
    return render_template("appstats/index.html", requests=_recent(), size=RECENT, billing=billing)


@bp.get("/appstats/<int:request_id>")
def timeline(request_id: int) -> ResponseReturnValue:
    """One request's timeline (admins: it says who asked for what)."""
    identity.require_admin()
    found = _timeline(request_id)
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
    """Admin: the last requests' costs in this process, newest first."""
    identity.require_admin()
    return jsonify(requests=_recent(), size=RECENT)


@bp.get("/api/appstats/<int:request_id>")
def api_timeline(request_id: int) -> ResponseReturnValue:
    """Admin: one recent request's costs and its calls' times."""
    identity.require_admin()
    return jsonify(_timeline(request_id))
