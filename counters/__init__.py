"""Sharded counters, the first lesson: simple.py (the talk's counter, whole: read it first), service.py (the named
counters beyond the talk) and writes.py (one +1 on a shard, per backend); beside them growth.py (configs, adaptive
growth), totals.py (reading), models.py, views.py (pages and /api/counters),
demo.py (demo content, the admin's burst).

Other features keep their own counters here through `service.owned(owner)`; counters depend on no other feature.
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
