"""gunicorn's settings file, read from the working directory by default (gunicorn's `--config`, default
./gunicorn.conf.py): App Engine's entrypoint (app.yaml) and devstack's gunicorn both start in the app's folder.

Each worker warms itself before it serves. A worker is a process of its own, with its own Datastore channel and cache
connections; App Engine's warmup request (/_ah/warmup) reaches one worker of an instance, and only when App Engine
sends one: Google says its warmup does "not work in every case", and an idle app's first request is a loading request
("Configuring warmup requests", https://cloud.google.com/appengine/docs/standard/configuring-warmup-requests).
"""
import os
from typing import Any


def on_starting(server: Any) -> None:
    """Called by gunicorn's master before it binds: the dev sign-in is never served off loopback (a client elsewhere
    can send `Host: 127.0.0.1`, which TRUSTED_HOSTS would take); gunicorn stops with the reason, binding nothing."""
    from core.settings import dev_signin_on, refuse_dev_signin_off_loopback

    try:
        refuse_dev_signin_off_loopback(dev_signin_on(os.environ), list(server.cfg.bind))
    except RuntimeError as e:
        server.log.critical("Not starting: %s", e)
        raise SystemExit(3) from None


def post_worker_init(worker: Any) -> None:
    """Called by gunicorn in each worker once it has loaded the app (main:app, built at import) and before it takes a
    request: the worker's first Datastore lookup and cache call happen here, not in a user's request."""
    from core import runtime

    app = worker.wsgi
    if runtime.EXTENSION not in getattr(app, "extensions", {}):  # another WSGI app served by gunicorn: nothing
        return
    from core.views import warm
    try:
        worker.log.info("worker %s warm: %s", worker.pid, warm(app))
    except Exception:  # gunicorn stops the whole server on an error here: a cold worker is better than none
        worker.log.exception("worker %s could not warm itself; it serves cold", worker.pid)
