"""Appstats: the last requests' costs of every process (core/costs.py counts them, captures.py keeps them in the
shared cache), for admins: /appstats and /api/appstats, linked from every page's footer."""
from flask import Flask

from appstats import views
from core import features


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    app.jinja_env.globals["request_costs_page"] = "appstats.index"  # the footer links it for admins (base.html)
    features.add(app, features.Feature(name="appstats"))
