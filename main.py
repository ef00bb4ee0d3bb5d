"""The app: `create_app()` for tests and scripts, `app` for gunicorn (App Engine's entrypoint and `make run`)."""
import logging
import os

import click
from flask import Flask

from core import identity, openapi, runtime, web
from core.datastore import NdbContextMiddleware
from core.settings import Settings

# Each a package with views.bp, and service.seed_demo() when it has demo content (seeded in this order: the numbers
# page measures last, on a stack that has its demo data).
FEATURES = ("counters", "blog", "comments", "mapper", "accounts", "tour", "latency")


def create_app(config=None):
    """Build the app. `config` overrides Flask settings; SETTINGS in it replaces the environment's."""
    app = Flask(__name__)
    settings = (config or {}).get("SETTINGS") or Settings.from_env()
    app.config.update(
        SETTINGS=settings,
        SECRET_KEY=settings.secret_key,
        MAX_CONTENT_LENGTH=256 * 1024,  # the largest legitimate body (a blog entry) is far smaller
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.on_app_engine,
        WTF_CSRF_CHECK_DEFAULT=False,  # web.init_app checks forms; the JSON API is protected by its content type
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the session: a page left open still posts
    )
    app.config.update(config or {})

    # Once per process, never per request: the ndb client (a gRPC channel), the memcached pool, the IAP keys.
    rt = runtime.configure(settings)
    app.extensions["iap_keys"] = identity.IapKeys()
    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, rt.datastore)

    web.init_app(app)
    from core.views import bp as core_bp
    app.register_blueprint(core_bp)
    for feature in FEATURES:
        app.register_blueprint(__import__(f"{feature}.views", fromlist=["bp"]).bp)
    app.extensions["openapi"] = openapi.build(app)  # once per process: GET /api/openapi.json serves it as it is

    @app.context_processor
    def inject_user():
        return {"current_user": identity.current_user()}

    @app.cli.command("seed")
    def seed():
        """Add the demo content of each feature that has none yet."""
        for feature, created in seed_demo():
            click.echo(f"{feature}: {'seeded' if created else 'already has content'}")

    return app


def seed_demo():
    """Each feature's demo content, where it has none yet (in the process's runtime): [(feature, seeded?)]."""
    seeded = []
    with runtime.current().datastore.context():
        for feature in FEATURES:
            seed = getattr(__import__(f"{feature}.service", fromlist=["seed_demo"]), "seed_demo", None)
            if seed is not None:
                seeded.append((feature, seed()))
    return seeded


def __getattr__(name):
    """`main:app` for gunicorn, built on first use: importing main (tests, scripts) builds no app."""
    if name == "app":
        logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"))
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
