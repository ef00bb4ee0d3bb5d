"""Admins: what the last requests of every process cost (Datastore RPCs and cache calls by method, time), and each
one's timeline: every round trip a bar from its start to its answer, as Appstats drew them. The captures are in the
shared cache (captures.py), so any process answers for any request."""
from typing import Any

from flask import Blueprint, jsonify, render_template, url_for
from flask.typing import ResponseReturnValue

from appstats import captures
from core import billing, costs, identity, runtime
from core.errors import AppError, Unavailable

bp = Blueprint("appstats", __name__)


def _recent() -> list[dict[str, Any]]:
    try:
        return captures.recent(runtime.current().cache)
    except captures.Away:
        raise Unavailable(captures.AWAY, "cache_away") from None


def _timeline(request_id: int) -> dict[str, Any]:
    """The request's capture with its timeline; a 404 that says why once it is no longer kept."""
    capture, trips = captures.kept_request(runtime.current().cache, request_id)
    counted = capture["datastore"]["rpcs"] + capture["cache"]["calls"]
    return {"request": capture, **costs.timeline(trips, counted), "most_calls": costs.MOST_CALLS}


@bp.get("/appstats")
def index() -> ResponseReturnValue:
    """The last requests' costs of every process, newest first; anyone but an admin gets the page without the list
    (it says who asked for what), with the refusal's status and what to do."""
    shown = {"size": captures.LISTED, "billing": billing,
             "signin": url_for("core.signin", next=url_for("appstats.index"))}
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
    # Under a latency profile a call's time is production's wait (the stand-in's, for an RPC) and this machine's
    # own: both shown, apart. A request that waited nothing (no profile) has no such columns.
    waited = any(call["wait_ms"] for call in found["calls"])
    rows = [{"label": call["name"], "start": call["start_ms"], "end": call["end_ms"], "kind": call["kind"],
             "critical": call["critical"], "detail": _detail(call, waited),
             **({"wait": call["wait_ms"], "machine": call["machine_ms"]} if waited else {})}
            for call in found["calls"]]
    capture = found["request"]
    bill = billing.Billed(**{k: capture["billed"][k] for k in ("reads", "writes", "deletes", "small")})
    return render_template("appstats/timeline.html", r=capture, rows=rows, cut=found["cut"],
                           most_calls=found["most_calls"], bill=bill.priced(" such requests"),
                           total=max([capture["app_ms"], *(row["end"] for row in rows)]))


def _detail(call: dict[str, Any], waited: bool) -> str:
    """'47.31 ms', or under a profile '47.31 ms: 46.90 production's wait, 0.41 this machine's'."""
    took = f"{call['end_ms'] - call['start_ms']:.2f} ms"
    if not waited:
        return took
    return f"{took}: {call['wait_ms']:.2f} production's wait, {call['machine_ms']:.2f} this machine's"


@bp.get("/api/appstats")
def api_recent() -> ResponseReturnValue:
    """Admin: the last requests' costs of every process, newest first."""
    identity.require_admin()
    return jsonify(requests=_recent(), size=captures.LISTED)


@bp.get("/api/appstats/<int:request_id>")
def api_timeline(request_id: int) -> ResponseReturnValue:
    """Admin: one recent request's costs and its calls' times."""
    identity.require_admin()
    return jsonify(_timeline(request_id))
