"""The tour: the home page's card per lesson and the source viewer, built from the features' registry."""
from flask import Flask

from core import features
from tour import views


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    features.add(app, features.Feature(name="tour"))
