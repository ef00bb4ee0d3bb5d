"""The mapper, the fourth lesson: a tree of tasks over key ranges. tree.py (one task: its page, its split, its
chunks; read it first), completion.py (progress and finishing a job exactly once, its on_done exactly once),
sweep.py (tasks whose process died taken up again, on cron), service.py (starting, listing, cancelling jobs), jobs.py
(what a job is, and the registry features add theirs to), keyrange.py (splitting a key range), models.py (a run, a
task's record and payload), views.py (/jobs and /api/jobs). Features register their jobs with
`jobs.register(app, job)` from their own init_app; the mapper knows none of them.
"""
from flask import Flask

from core import features, runtime
from mapper import completion, demo, production, tree, views


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    runtime.of(app).tasks.register(tree.TASK_HANDLER, tree.run_task)
    runtime.of(app).tasks.register(completion.CHECK_HANDLER, completion.run_check)
    runtime.of(app).tasks.register(completion.DONE_HANDLER, completion.run_follow_up)
    features.add(app, features.Feature(
        name="mapper", nav=("mapper.jobs", "Jobs"),
        lesson=features.Lesson(
            slug="mapper", title="4. Adaptive sharding: a mapper",
            sources=("mapper/tree.py", "mapper/models.py", "mapper/completion.py", "mapper/keyrange.py"),
            figure=demo.figure, card="mapper/_lesson.html", caveats=production.CAVEATS)))
