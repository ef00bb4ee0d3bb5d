"""The app: `create_app()` for tests and scripts, `app` for gunicorn (App Engine's entrypoint and `make run`)."""
import datetime
import logging
import os
from types import ModuleType
from typing import Any

import click
from flask import Flask

import accounts
import appstats.accounting
import blog
import comments
import counters
import latency
import mapper
import planner
import tour
from core import features, identity, markers, openapi, runtime, web
from core import views as core_views
from core.settings import Settings, with_secret_key
from core.tasks import Queue

# The one list of features, each a package with init_app(app). Registered, and their demo content seeded, in this
# order: a feature comes after those it builds on, and the numbers page measures last, on a stack with demo data.
FEATURES = (counters, blog, comments, mapper, accounts, tour, latency, planner, appstats)


def create_app(settings: Settings | None = None, *, task_queue: Queue | None = None,
               features_list: tuple[ModuleType, ...] = FEATURES, **flask_config: Any) -> Flask:
    """Build the app on `settings` (default: the environment's, read once). `task_queue` replaces the settings' queue
    (tests and benchmarks deliver tasks themselves: devstack.taskqueue). `features_list` is FEATURES, or a part of it
    that keeps each feature's dependencies (the tests show blog standing alone). `flask_config` overrides Flask
    settings (TESTING=True). devstack.apps.app_on builds one on a local stack."""
    app = Flask(__name__)
    settings = settings or Settings.from_env()
    app.config.update(
        SECRET_KEY=settings.secret_key,
        MAX_CONTENT_LENGTH=web.BODY_BYTES,  # each route's own limit: web.body_limit
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.on_app_engine,
        WTF_CSRF_CHECK_DEFAULT=False,  # web.init_app checks forms; the JSON API is protected by its content type
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the session: a page left open still posts
        # Flask refuses a session cookie signed longer ago than this, permanent session or not. That age restarts
        # whenever the session changes, so it is not what ends a sign-in: core/identity.py checks the sign-in's own
        # time on every request (SESSION_HOURS after it, however the cookie was used) and ends every copy of the
        # cookie at sign-out.
        PERMANENT_SESSION_LIFETIME=datetime.timedelta(hours=identity.SESSION_HOURS),
    )
    app.config.update(flask_config)

    # Once per process, never per request: the ndb client (a gRPC channel), the memcached pool, Google's keys. The
    # runtime is this app's own; each request makes it current (services read it through core.runtime.current()).
    rt = app.extensions[runtime.EXTENSION] = runtime.Runtime(settings, task_queue)
    app.extensions["google_keys"] = identity.GoogleKeys()
    app.wsgi_app = runtime.RequestMiddleware(app.wsgi_app, rt)  # type: ignore[method-assign]

    web.init_app(app)
    rt.tasks.register(markers.PURGE_HANDLER, markers.purge)  # every feature's expired idempotency markers
    appstats.accounting.init_app(app)  # every app's, whichever features it has: its page is the appstats feature
    app.register_blueprint(core_views.bp)
    for feature in features_list:
        feature.init_app(app)
    features.of(app).complete()
    app.add_template_global(features.of(app).caveats, "production_caveats")
    app.extensions["openapi"] = openapi.build(app)  # once per process: GET /api/openapi.json serves it as it is

    @app.cli.command("seed")
    def seed() -> None:
        """Add the demo content of each feature that has none yet."""
        for name, created in seed_demo(app):
            click.echo(f"{name}: {'seeded' if created else 'already has content'}")

    return app


def seed_demo(app: Flask) -> list[tuple[str, bool]]:
    """Each feature's demo content, where it has none yet: [(feature, seeded?)]."""
    with runtime.of(app).context():
        return [(f.name, f.seed()) for f in features.of(app).all if f.seed]


def __getattr__(name: str) -> Flask:
    """`main:app` for gunicorn, built on first use: importing main (tests, scripts) builds no app."""
    if name == "app":
        logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"))
        try:
            settings = Settings.from_env(with_secret_key(os.environ))
        except RuntimeError as e:  # a setting missing or wrong: one line that says what to set, not a traceback
            logging.getLogger(__name__).critical("Not starting: %s", e)
            raise SystemExit(3) from None  # gunicorn's "worker failed to boot": it stops rather than respawning
        globals()["app"] = create_app(settings)
        return globals()["app"]
    raise AttributeError(name)
