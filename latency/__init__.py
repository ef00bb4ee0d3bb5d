"""The numbers page: what each Datastore and memcache operation costs on this stack, beside the talk's figures."""
from flask import Flask

from core import features
from latency import demo, views


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    features.add(app, features.Feature(name="latency", nav=("latency.index", "Numbers"), seed=demo.seed))
