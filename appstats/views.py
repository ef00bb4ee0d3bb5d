"""Admins: what the last requests served by this process cost (Datastore RPCs and cache calls by method, time)."""
from flask import Blueprint, current_app, jsonify, render_template

from appstats.accounting import RECENT
from core import billing, identity
from core.errors import AppError

bp = Blueprint("appstats", __name__)


def _recent():
    return list(current_app.extensions["appstats"])


@bp.get("/appstats")
def index():
    """The last requests' costs, newest first (this process only: each gunicorn worker keeps its own). Anyone else
    gets the page without the list (it says who asked for what), with the refusal's status and what to do."""
    try:
        identity.require_admin()
    except AppError as e:
        return render_template("appstats/index.html", requests=None, refused=e.message, size=RECENT,
                               billing=billing), e.status
    return render_template("appstats/index.html", requests=_recent(), size=RECENT, billing=billing)


@bp.get("/api/appstats")
def api_recent():
    """Admin: the last requests' costs in this process, newest first."""
    identity.require_admin()
    return jsonify(requests=_recent(), size=RECENT)
