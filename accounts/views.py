"""Accounts: the /accounts page (seed, summary, credit everyone) and /api/accounts routes."""
from typing import Any

from flask import Blueprint, flash, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from accounts import credit, service
from core import idempotency, identity, runtime, validate
from core.errors import AppError
from core.web import form_refused, json_body
from mapper import service as mapper

bp = Blueprint("accounts", __name__)


@bp.get("/accounts")
def index(status: int = 200, comparison: dict[str, Any] | None = None) -> tuple[str, int]:
    """How many accounts, their total balance, the latest audit, and (admins) forms to seed, credit and audit; also
    the page a refused form is shown again on, with its `status`, and a comparison's."""
    return render_template("accounts/index.html", summary=service.summary(identity.reads_exactly()),
                           audit=service.latest_audit(),
                           comparison=comparison, max_seed=service.MAX_SEED, max_amount=credit.MAX_AMOUNT,
                           # only Firestore in Datastore mode has aggregation queries
                           aggregations=runtime.current().settings.backend == "firestore"), status


@bp.post("/accounts/seed")
def seed_form() -> ResponseReturnValue:
    """Seed accounts in the background; the form's token makes a resend of it seed nothing more."""
    user = identity.require_admin()
    try:
        seeded, _ = service.seed(validate.form_number(request.form.get("count")),
                                 request.form.get("start_token") or None, user["id"])
    except AppError as e:
        return form_refused(e, index)
    # The banner is the app's own message, carried in the session: a query parameter would let any link put a
    # visitor's text on the page.
    flash(f"Seeding {seeded['count']} accounts in the background; reload to see them arrive.", "info")
    return redirect(url_for("accounts.index"))


def _start_job(name: str, params: dict[str, Any]) -> ResponseReturnValue:
    """Admin: start job `name` from its form; the form's token makes a resend of it answer the first job."""
    user = identity.require_admin()
    try:
        job = mapper.start_job(name, params, idempotency_key=request.form.get("start_token") or None, user=user["id"])
    except AppError as e:
        return form_refused(e, index)
    return redirect(url_for("mapper.job", job_id=job.id))


@bp.post("/accounts/credit")
def credit_form() -> ResponseReturnValue:
    return _start_job(credit.ADD_CREDIT.name, {"amount": validate.form_number(request.form.get("amount"))})


@bp.post("/accounts/audit")
def audit_form() -> ResponseReturnValue:
    return _start_job(service.AUDIT.name, {})


@bp.post("/accounts/aggregation")
def aggregation_form() -> ResponseReturnValue:
    """Admin: the kept figures beside COUNT and SUM over the accounts, timed now, shown on the page."""
    identity.require_admin()
    return index(comparison=service.compare_with_aggregation())


@bp.post("/api/accounts/aggregation")
def api_aggregation() -> ResponseReturnValue:
    """Admin: the kept figures beside COUNT and SUM aggregation queries over the accounts, each timed now."""
    identity.require_admin()
    return jsonify(service.compare_with_aggregation())


@bp.get("/api/accounts/audit")
def api_audit() -> ResponseReturnValue:
    """The latest audit's result: what it counted beside what the app keeps; null before any audit finished."""
    return jsonify(audit=service.latest_audit())


@bp.post("/api/accounts/seed")
def api_seed() -> ResponseReturnValue:
    """Seed {"count": 1..100000} accounts in the background -> 202; a resend of its Idempotency-Key seeds nothing."""
    user = identity.require_admin()
    seeded, replayed = service.seed(json_body().get("count"), request.headers.get("Idempotency-Key"), user["id"])
    return idempotency.marked(jsonify(seeded), replayed), 202


@bp.get("/api/accounts/summary")
def api_summary() -> ResponseReturnValue:
    """{"count", "total_balance"} over every account: read for an admin, from a copy seconds old for anyone else."""
    return jsonify(service.summary(identity.reads_exactly()))
