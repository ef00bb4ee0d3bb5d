"""The planner: a form for each on /numbers, its answer shown there, and POST /api/plan."""
from typing import Any

from flask import Blueprint, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from core import identity, validate
from core.errors import AppError, Unprocessable
from core.web import form_refused, json_body
from latency import service as numbers
from planner import service

bp = Blueprint("planner", __name__)


def _page(status: int = 200, plan: dict[str, Any] | None = None) -> tuple[str, int]:
    return render_template("latency/index.html", **numbers.page(), plan=plan), status


def _form_inputs(spec: service.Planner) -> dict[str, Any]:
    """The form's fields as the API's inputs: numbers as ints (blank: left out), choices as sent."""
    form = request.form
    inputs: dict[str, Any] = {c.name: form[c.name] for c in spec.choices if c.name in form}
    if spec.rpcs and form.get("appstats"):  # a recorded request: the record says the rest
        return {"appstats": validate.form_number(form["appstats"]), **inputs}
    for n in spec.numbers:
        inputs |= {field: validate.form_number(form[field]) for field in n.fields() if form.get(field)}  # the API's
        if n.rate and form.get(n.name):  # the page's: a number, and its unit beside it
            inputs[f"{n.name}_per_{form.get(f'{n.name}_per', 'second')}"] = validate.form_number(form[n.name])
    if spec.rpcs:
        inputs["rpcs"] = {m: validate.form_number(form[f"rpcs.{m}"]) for m in service.RPC_METHODS
                          if form.get(f"rpcs.{m}")}
    return inputs


def _answer(planner: object, inputs: object) -> dict[str, Any]:
    """The planner's answer; an /appstats record as input is for admins only, as /appstats is."""
    if isinstance(inputs, dict) and "appstats" in inputs:
        identity.require_admin()
    return service.plan(planner, inputs)


@bp.post("/numbers/plan")
def plan_form() -> ResponseReturnValue:
    """A planner's answer to the form's inputs, on the numbers page. Computes; writes nothing."""
    try:
        spec = service.PLANNERS.get(request.form.get("planner", ""))
        answer = _answer(request.form.get("planner"), _form_inputs(spec) if spec else {})  # no such planner: a 422
    except AppError as e:
        return form_refused(e, _page)
    return _page(plan=answer)


@bp.post("/api/plan")
def api_plan() -> ResponseReturnValue:
    """{"planner", "inputs"} -> the planner's answer: its figures, its arithmetic, its answers. Writes nothing."""
    body = json_body()
    unknown = sorted(set(body) - {"planner", "inputs"})
    if unknown:
        raise Unprocessable(f"The body takes planner and inputs; not {', '.join(unknown)[:200]}.", "bad_body")
    return jsonify(_answer(body.get("planner"), body.get("inputs")))
