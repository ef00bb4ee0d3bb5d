"""Appstats: the last requests' costs in this process (core/costs.py counts them), for admins: /appstats and
/api/appstats, linked from every page's footer. views.py only: the figures are kept by core, in memory, bounded."""
from appstats import views
from core import features


def init_app(app):
    app.register_blueprint(views.bp)
    app.add_template_global("appstats.index", "request_costs_page")  # the footer links it for admins (base.html)
    features.add(app, features.Feature(name="appstats"))
