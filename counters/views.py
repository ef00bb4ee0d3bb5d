"""Counters: the /counters page with its forms, and the /api/counters and /api/simple-counter routes."""
from typing import Any

from flask import Blueprint, flash, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from core import budget, idempotency, identity, runtime, validate
from core.errors import Unprocessable
from core.web import json_body
from counters import demo, growth, models, service, simple, totals
from counters.models import CounterConfig

bp = Blueprint("counters", __name__)


@bp.url_value_preprocessor
def public_names_only(endpoint: str | None, values: dict[str, Any] | None) -> None:
    """Every route with a counter name in its URL takes public names only: a feature's own counter is a 403 for
    everyone, before any other check."""
    if values and "name" in values:
        models.public_name(values["name"])


def _counter_json(config: CounterConfig, total: totals.Total) -> dict[str, Any]:
    return {"name": config.name, "mode": config.mode, "count": total.count, "num_shards": config.num_shards,
            "cached": total.cached}


def _spend_if_new(name: str) -> None:
    """A signed-in person's write that creates counter `name` spends one of their budget's new counters
    (core/budget.py): every counter is listed for everyone. Adding to one that exists spends nothing."""
    user = identity.current_user()
    if user is not None and growth.get_config(name) is None:
        budget.spend(user["id"], "counters")


def _form_int(field: str) -> int:
    """A form's whole number, checked as the API's JSON numbers are (validate.form_number: ASCII digits only)."""
    value = validate.form_number(request.form.get(field, ""))
    if not isinstance(value, int):
        raise Unprocessable(f"{field} must be a whole number.", f"bad_{field}")
    return value


@bp.get("/counters")
def index() -> ResponseReturnValue:
    """The counters by name, a page at a time (`?after=<name>`), each with its total and its shards drawn."""
    page = totals.counters_page(request.args.get("after"), not identity.reads_exactly())
    return render_template("counters/index.html", counters=page.counters, next=page.next,
                           first=request.args.get("after") is None, simple=page.simple, simple_total=sum(page.simple),
                           max_shards=models.MAX_SHARDS, burst_name=demo.new_burst_name())


@bp.post("/counters/simple/increment")
def increment_simple_form() -> ResponseReturnValue:
    simple.increment()
    return redirect(url_for("counters.index") + "#simple")


def _increment(name: str, idempotency_key: str | None = None) -> service.Increment:
    """+1 on a public counter; only a signed-in user's increment creates it, or carries an Idempotency-Key."""
    _spend_if_new(name)
    user = identity.current_user()
    return service.increment(name, idempotency_key, create=user is not None, caller=user["id"] if user else None)


@bp.post("/counters/<name>/increment")
def increment_form(name: str) -> ResponseReturnValue:
    """A named counter's +1 button (its token makes a resent form, or the script's fallback, count once)."""
    _increment(name, request.form.get("idempotency_key") or None)
    return redirect(url_for("counters.index") + f"#counter-{name}")


@bp.post("/counters")
def create_form() -> ResponseReturnValue:
    """Admin: create a counter."""
    identity.require_admin()
    name = models.public_name(request.form.get("name", "").strip())
    num_shards = _form_int("num_shards") if request.form.get("num_shards") else None
    _spend_if_new(name)
    growth.configure(name, request.form.get("mode", ""), num_shards)
    flash(f"Counter {name} is ready.", "info")
    return redirect(url_for("counters.index") + f"#counter-{name}")


@bp.post("/counters/<name>/shards")
def shards_form(name: str) -> ResponseReturnValue:
    """Admin: raise a counter's shard count."""
    identity.require_admin()
    config = growth.increase_shards(name, _form_int("num_shards"))
    flash(f"{name} has {config.num_shards} shards.", "info")
    return redirect(url_for("counters.index") + f"#counter-{name}")


@bp.post("/counters/<name>/burst")
def burst_form(name: str) -> ResponseReturnValue:
    """Admin: many concurrent increments at once, to watch contention and growth."""
    identity.require_admin()
    done, attempts, num_shards = demo.burst(name, _form_int("writers"), _form_int("increments"))
    flash(f"{name}: {done} increments from {request.form['writers']} writers took {attempts / done:.2f} attempts "
          f"each; it has {num_shards} shards now.", "info")
    return redirect(url_for("counters.index") + f"#counter-{name}")


@bp.post("/counters/burst-new")
def burst_new_form() -> ResponseReturnValue:
    """Admin: a new adaptive counter and a burst on it, to watch it grow from one shard."""
    user = identity.require_admin()
    budget.spend(user["id"], "counters")  # a new counter each time
    given = request.form.get("name", "").strip()
    name, done, attempts, num_shards = demo.burst_new_adaptive(models.public_name(given) if given else None)
    if num_shards > 1:
        grew = f"it grew from 1 shard to {num_shards}."
    elif runtime.current().settings.backend == "firestore":
        grew = ("it stayed at 1 shard: on Firestore an increment is a blind server-side write, which never collides, "
                "so nothing asked it to grow (production still holds one entity to about one sustained write a "
                "second).")
    else:
        grew = "it stayed at 1 shard: its writers did not collide often enough to ask for more."
    flash(f"New adaptive counter {name}: {done} increments from 16 writers took {attempts / done:.2f} attempts each; "
          f"{grew}", "info")
    return redirect(url_for("counters.index"))


@bp.get("/api/counters")
def api_list() -> ResponseReturnValue:
    """Every counter with its total (the first 100 by name)."""
    return jsonify(counters=[_counter_json(c, t) for c, t, _ in totals.list_counters()])


@bp.get("/api/counters/<name>")
def api_get(name: str) -> ResponseReturnValue:
    """One counter; `?shards=1` adds each shard's count (a few seconds old for anyone but an admin: a bounded bill)."""
    config = growth.require_config(name)
    if validate.flag(request.args.get("shards"), "shards"):
        total, shards = totals.total_and_shards(config, not identity.reads_exactly())
        return jsonify({**_counter_json(config, total), "shards": shards})
    return jsonify(_counter_json(config, totals.get_total(name, config)))


@bp.post("/api/counters/<name>/increment")
def api_increment(name: str) -> ResponseReturnValue:
    """+1, at most once per Idempotency-Key (a signed-in caller's; a resend answers the first answer again);
    creating a counter needs a signed-in user."""
    result = _increment(name, request.headers.get("Idempotency-Key"))
    return idempotency.marked(jsonify(name=name, applied=result.applied, attempts=result.attempts), result.replayed)


@bp.put("/api/counters/<name>")
def api_configure(name: str) -> ResponseReturnValue:
    """Admin: create a counter in a mode, or grow it."""
    identity.require_admin()
    data = json_body()
    _spend_if_new(name)
    config = growth.configure(name, data.get("mode"), data.get("num_shards"))
    return jsonify(_counter_json(config, totals.get_total(name, config)))


@bp.post("/api/counters/<name>/shards")
def api_shards(name: str) -> ResponseReturnValue:
    """Admin: raise the shard count (never lowers)."""
    identity.require_admin()
    config = growth.increase_shards(name, json_body().get("num_shards"))
    return jsonify(name=config.name, num_shards=config.num_shards)


@bp.post("/api/counters/<name>/burst")
def api_burst(name: str) -> ResponseReturnValue:
    """Admin: {"writers": 1..32, "increments": 1..500} concurrent increments."""
    identity.require_admin()
    data = json_body()
    done, attempts, num_shards = demo.burst(name, data.get("writers"), data.get("increments"))
    return jsonify(name=name, increments=done, attempts=attempts, num_shards=num_shards)


@bp.get("/api/simple-counter")
def api_simple() -> ResponseReturnValue:
    """The talk's twenty-shard counter: its cached total, and with `shards=1` every shard (read for an admin, the count
    their sum; from a copy seconds old for anyone else)."""
    if validate.flag(request.args.get("shards"), "shards"):
        exactly = identity.reads_exactly()
        shards = totals.simple_shard_counts(exactly)
        return jsonify(count=sum(shards) if exactly else simple.total(), num_shards=simple.SHARDS, shards=shards)
    return jsonify(count=simple.total(), num_shards=simple.SHARDS)


@bp.post("/api/simple-counter/increment")
def api_simple_increment() -> ResponseReturnValue:
    return jsonify(applied=True, attempts=simple.increment())
