"""The mapper, the fourth lesson: a tree of tasks over key ranges. Read tree.py first (one task: scan, hand out,
split, chunk with the record), then delivery.py (the queue's handler around it); the others: docs/layout.md.
Features register their jobs with `jobs.register(app, job)` from their own init_app; the mapper knows none of them."""
from flask import Flask

from core import features, runtime
from mapper import completion, delivery, demo, production, queueing, views


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    runtime.of(app).tasks.register(queueing.TASK_HANDLER, delivery.run_task)
    runtime.of(app).tasks.register(completion.CHECK_HANDLER, completion.run_check)
    runtime.of(app).tasks.register(completion.DONE_HANDLER, completion.run_follow_up)
    features.add(app, features.Feature(
        name="mapper", nav=("mapper.jobs", "Jobs"),
        lesson=features.Lesson(
            slug="mapper", title="4. Many small tasks: a mapper",
            sources=("mapper/tree.py", "mapper/task.py", "mapper/keyrange.py", "mapper/completion.py"),
            figure=demo.figure, card="mapper/_lesson.html", caveats=production.CAVEATS)))
