"""Sharded counters, the first lesson: its sources below, in reading order (simple.py, the talk's counter whole,
first); beside them views.py (pages and /api/counters) and demo.py (demo content, the admin's burst). Other features
keep their own counters here through `service.owned(owner)`; counters depend on no other feature.
"""
from flask import Flask

from core import features
from counters import demo, production, views


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    features.add(app, features.Feature(
        name="counters", nav=("counters.index", "Counters"),
        lesson=features.Lesson(
            slug="counters", title="1. Sharded counters",
            sources=("counters/simple.py", "counters/service.py", "counters/writes.py", "counters/growth.py",
                     "counters/totals.py", "counters/models.py"),
            figure=demo.figure, card="counters/_lesson.html", caveats=production.CAVEATS),
        seed=demo.seed))
