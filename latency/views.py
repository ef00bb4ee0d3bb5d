"""The numbers page: what each Datastore and memcache operation costs here, beside the talk's figures."""
from flask import Blueprint, jsonify, redirect, render_template, url_for
from flask.typing import ResponseReturnValue

from core import identity, people
from core.errors import found
from latency import service

bp = Blueprint("latency", __name__)


@bp.get("/numbers")
def index() -> ResponseReturnValue:
    """The latest measurement and (admins) a button to measure again."""
    return render_template("latency/index.html", **service.page())


@bp.post("/numbers")
def measure_form() -> ResponseReturnValue:
    user = identity.require_admin()
    service.measure(people.display_name(user["email"]))
    return redirect(url_for("latency.index"))


@bp.get("/api/numbers")
def api_latest() -> ResponseReturnValue:
    """The latest measurement; 404 before the first."""
    return jsonify(found(service.latest(), "Nothing was measured yet.", "not_measured"))


@bp.get("/api/numbers/standin")
def api_standin() -> ResponseReturnValue:
    """Every figure the stand-in waits by: its knobs, the round trips by profile, the tail; whose each is."""
    return jsonify(service.standin())


@bp.post("/api/numbers")
def api_measure() -> ResponseReturnValue:
    """Measure now (admin) -> 201 the new measurement."""
    user = identity.require_admin()
    return jsonify(service.measure(people.display_name(user["email"]))), 201
