"""Accounts, the mapper's demo kind: seeding (in tasks), the summary and audit (service.py), add_credit (credit.py)."""
from flask import Flask

from accounts import credit, demo, service, views
from core import features, runtime
from mapper import jobs as mapper_jobs


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    runtime.of(app).tasks.register(service.SEED_HANDLER, service.seed_batch)
    for job in (credit.ADD_CREDIT, credit.ADD_CREDIT_INCREMENTS, service.AUDIT):
        mapper_jobs.register(app, job)
    features.add(app, features.Feature(name="accounts", nav=("accounts.index", "Accounts"), seed=demo.seed))
