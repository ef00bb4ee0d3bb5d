"""The planner on /numbers (and POST /api/plan): a design's shards, bills and waits, worked out from the numbers
before it is built, each figure saying whose it is."""
from flask import Flask

from core import features
from planner import request, service, views
from planner.figures import PER


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    # The numbers page (latency/) shows a form for each planner when the planner is registered.
    app.jinja_env.globals.update(planners=service.PLANNERS, rpc_methods=service.RPC_METHODS,
                                 most_rpcs=service.MOST_RPCS, rate_units=tuple(PER),
                                 recorded_requests=request.recent_requests)
    features.add(app, features.Feature(name="planner"))
