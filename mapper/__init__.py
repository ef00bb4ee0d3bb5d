"""The mapper, the fourth lesson: a tree of tasks over key ranges. service.py (starting, running, finishing jobs),
keyrange.py (splitting a key range), models.py, views.py (/jobs and /api/jobs). Features register their jobs with
`service.register(app, job)` from their own init_app; the mapper knows none of them.
"""
from core import features, runtime
from mapper import demo, production, service, views


def init_app(app):
    app.register_blueprint(views.bp)
    runtime.of(app).tasks.register(service.TASK_HANDLER, service.run_task)
    runtime.of(app).tasks.register(service.CHECK_HANDLER, service.run_check)
    features.add(app, features.Feature(
        name="mapper", nav=("mapper.jobs", "Jobs"),
        lesson=features.Lesson(
            slug="mapper", title="4. Adaptive sharding: a mapper", sources=("mapper/service.py", "mapper/keyrange.py"),
            figure=demo.figure, card="mapper/_lesson.html", caveats=production.CAVEATS)))
