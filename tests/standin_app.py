"""What gunicorn serves for tests/test_standin.py (`tests.standin_app:app()`): each `POST /write/<name>?id=<i>` writes
entity Tally `name` once, a blind put (one non-transactional Commit, no retry: nothing in the app hides what the
Datastore answered), and answers {"id", "pid", "at": when the commit was answered, "error": the Datastore's message or
null}; `/healthz` answers ok. Settings from the environment, as the app's own (core/settings.py)."""
import json
import os
import time

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import runtime


class Tally(ndb.Model):
    _use_cache = _use_global_cache = False
    last = ndb.IntegerProperty()  # the id of the write that landed last


def app():
    rt = runtime.Runtime()

    def wsgi(environ, start_response):
        path = environ["PATH_INFO"]
        if not path.startswith("/write/"):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]
        write_id = int(environ["QUERY_STRING"].partition("id=")[2] or 0)
        error = None
        with rt.context():
            try:
                Tally(id=path.removeprefix("/write/"), last=write_id).put(retries=0)
            except core_exceptions.GoogleAPICallError as failed:
                error = f"{failed.grpc_status_code.name if failed.grpc_status_code else ''} {failed.message}"
        body = json.dumps({"id": write_id, "pid": os.getpid(), "at": time.time(), "error": error}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    return wsgi
