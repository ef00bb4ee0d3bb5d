"""The real stack for the tests: one emulator (the legacy Datastore emulator in memory at consistency 1.0, or with
DATASTORE=firestore the Firestore emulator in Datastore mode) and one memcached per session, started here on free
loopback ports and stopped at the end. Every test starts from an empty datastore (reset, or a namespace of its own)
and an empty cache.

Nothing here, or in any test, stands in for Datastore or memcached: fault tests stop or freeze the real processes.
"""
import json
import os
import re
import uuid

import pytest
from flask import request
from openapi_core import OpenAPI
from openapi_core.contrib.flask import FlaskOpenAPIRequest, FlaskOpenAPIResponse

from core import runtime, tasks
from core.settings import Settings
from devstack import Stack
from devstack.services import backend_from_env
from main import create_app

RULE_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")  # Flask's <int:index> is OpenAPI's {index}


def _settings(stack, **overrides):
    env = dict(stack.env(), SECRET_KEY="test-secret", ADMIN_EMAILS="boss@example.com", TASKS_BACKEND="queue")
    env.update(overrides)
    return Settings.from_env(env)


def fresh_datastore(stack):
    """An empty datastore for the next test: the legacy emulator is reset; the Firestore emulator has no reset in
    Datastore mode, so the test gets a namespace of its own. Returns the settings overrides that select it."""
    if stack.backend == "legacy":
        stack.emulator.reset()
        return {}
    return {"DATASTORE_NAMESPACE": f"t{uuid.uuid4().hex[:16]}"}


def fresh_stack(stack):
    """`fresh_datastore`, and memcached running (a fault test that failed half way may have left it stopped)."""
    overrides = fresh_datastore(stack)
    if not stack.memcached.healthy():
        stack.memcached.restart()
    return overrides


class _RequestWithoutBody(FlaskOpenAPIRequest):
    """The request as openapi-core needs it to find the operation a response answers: its body is not needed (and
    reading a body the app refused as too large would only raise the 413 again)."""

    @property
    def body(self):
        return None


class ContractCheck:
    """Every response the app gives to a documented operation is validated against its OpenAPI document (openapi-core),
    and every /api route must be documented; what does not match is kept for the test's teardown to fail on."""
    _validators = {}  # document as JSON -> its validator: built once per session, not once per app

    def __init__(self, app):
        self.document = app.extensions["openapi"]
        key = json.dumps(self.document, sort_keys=True)
        if key not in self._validators:
            self._validators[key] = OpenAPI.from_dict(self.document)
        self.validator = self._validators[key]
        self.breaches = []
        self.checked = 0
        app.after_request(self)

    def __call__(self, response):
        if request.url_rule is None:  # no route matched (404, 405): no operation to hold it to
            return response
        path = RULE_PARAMETER.sub(r"{\1}", request.url_rule.rule)
        operation = self.document["paths"].get(path, {}).get(request.method.lower())
        where = f"{request.method} {request.full_path.rstrip('?')} -> {response.status_code}"
        if operation is None:
            if path.startswith("/api/"):
                self.breaches.append(f"{where}: the route is not in the OpenAPI document")
            return response
        try:
            self.validator.validate_response(_RequestWithoutBody(request), FlaskOpenAPIResponse(response))
            self.checked += 1
        except Exception as e:  # noqa: BLE001 - every kind of mismatch is reported, with its cause
            self.breaches.append(f"{where}: {e}; {e.__cause__ or ''} {getattr(e.__cause__, 'schema_errors', '')}")
        return response

    def assert_kept(self):
        assert not self.breaches, "responses that do not match the OpenAPI document:\n" + "\n".join(self.breaches)


def contract_checked(app):
    """`app`, its responses checked against its OpenAPI document; `app.extensions["contract"].assert_kept()` at the
    end of the test."""
    app.extensions["contract"] = ContractCheck(app)
    return app


@pytest.fixture(scope="session")
def stack():
    """The backend `make test DATASTORE=legacy|firestore` names (legacy by default)."""
    with Stack(consistency=1.0, backend=backend_from_env()) as s:
        yield s


@pytest.fixture
def backend(stack):
    """"legacy" or "firestore": for the few assertions where the backends rightly differ (contention)."""
    return stack.backend


@pytest.fixture
def app(stack):
    app = contract_checked(create_app({"TESTING": True, "SETTINGS": _settings(stack, **fresh_stack(stack))}))
    runtime.current().memcache_client.flush_all(noreply=False)
    yield app
    runtime.current().close()
    app.extensions["contract"].assert_kept()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def ndb_context(app):
    """Service-level tests run inside an ndb context, as a request would."""
    with runtime.current().datastore.context():
        yield


class Tasks:
    """The test's task queue (core.tasks.DrainedQueue): tasks wait until `drain` delivers them through the app's task
    route, as a real queue would, on `workers` threads; `fail(task)` may make a delivery fail first."""

    def __init__(self, app):
        self.app = app
        self.queue = runtime.current().tasks
        self.token = tasks.local_token(app.config["SETTINGS"].secret_key)
        self.responses = []

    def deliver(self, task):
        response = self.app.test_client().post(tasks.ROUTE.format(task.handler), data=task.body(),
                                               headers=tasks.local_headers(self.token, task))
        self.responses.append((task, response.status_code, response.get_json()))
        return 200 <= response.status_code < 300

    def drain(self, workers=1, deliver=None, **limits):
        return self.queue.drain(deliver or self.deliver, workers=workers, **limits)


@pytest.fixture
def task_queue(app):
    return Tasks(app)


class Auth:
    def __init__(self, client):
        self.client = client

    def sign_in(self, email="user@example.com", admin=False):
        r = self.client.post("/api/session", json={"email": email, "admin": admin})
        assert r.status_code == 200, r.get_data(as_text=True)
        return r.get_json()["user"]

    def admin(self):
        return self.sign_in("boss@example.com", admin=True)

    def sign_out(self):
        assert self.client.delete("/api/session").status_code == 204


@pytest.fixture
def auth(client):
    return Auth(client)


def csrf_token(client, path="/counters"):
    """The CSRF token a page's forms carry."""
    html = client.get(path).get_data(as_text=True)
    return re.search(r'name="csrf-token" content="([^"]+)"', html).group(1)


def in_threads(count, fn):
    """Run fn(i) for i in range(count) on `count` threads at once, each in its own ndb context; their results."""
    return runtime.current().datastore.map_in_threads(fn, range(count))


@pytest.fixture(scope="session")
def legacy_stack(stack):
    """A legacy Datastore emulator: the test session's own under DATASTORE=legacy, else one of its own, for what only
    the legacy emulator checks (index.yaml)."""
    if stack.backend == "legacy":
        yield stack
        return
    with Stack(consistency=1.0) as s:
        yield s


@pytest.fixture(scope="session")
def firestore_stack(stack):
    """A Firestore emulator in Datastore mode: the session's own under DATASTORE=firestore, else one of its own, for
    what only Firestore does (server-side increments)."""
    if stack.backend == "firestore":
        yield stack
        return
    with Stack(backend="firestore") as s:
        yield s


@pytest.fixture
def legacy_app(legacy_stack):
    app = create_app({"TESTING": True, "SETTINGS": _settings(legacy_stack, **fresh_stack(legacy_stack))})
    yield app
    runtime.current().close()


@pytest.fixture
def weak_stack():
    """A legacy emulator at its default consistency (0.9), for code that claims strong consistency: only the legacy
    emulator can lag (Firestore in Datastore mode is strongly consistent), so this is one under either backend."""
    with Stack(consistency=0.9) as s:
        yield s


@pytest.fixture
def weak_app(weak_stack):
    app = contract_checked(create_app({"TESTING": True, "SETTINGS": _settings(weak_stack)}))
    yield app
    runtime.current().close()
    app.extensions["contract"].assert_kept()


def pytest_report_header(config):
    return [f"real stack: Datastore emulator + memcached started by tests/conftest.py (pid {os.getpid()})"]
