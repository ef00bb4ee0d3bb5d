"""The real stack for the tests: one Datastore emulator (in memory, consistency 1.0) and one memcached per session,
started here on free loopback ports and stopped at the end. Every test starts from an empty datastore and cache.

Nothing here, or in any test, stands in for Datastore or memcached: fault tests stop or freeze the real processes.
"""
import os
import re

import pytest

from core import runtime, tasks
from core.settings import Settings
from devstack import Stack
from main import create_app


def _settings(stack, **overrides):
    env = dict(stack.env(), SECRET_KEY="test-secret", ADMIN_EMAILS="boss@example.com", TASKS_BACKEND="queue")
    env.update(overrides)
    return Settings.from_env(env)


@pytest.fixture(scope="session")
def stack():
    with Stack(consistency=1.0) as s:
        yield s


@pytest.fixture
def app(stack):
    stack.emulator.reset()
    if not stack.memcached.healthy():  # a fault test that failed half way may have left it stopped
        stack.memcached.restart()
    app = create_app({"TESTING": True, "SETTINGS": _settings(stack)})
    runtime.current().memcache_client.flush_all(noreply=False)
    yield app
    runtime.current().close()


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


@pytest.fixture
def weak_stack():
    """A second emulator at the emulator's default consistency (0.9), for code that claims strong consistency."""
    with Stack(consistency=0.9) as s:
        yield s


@pytest.fixture
def weak_app(weak_stack):
    app = create_app({"TESTING": True, "SETTINGS": _settings(weak_stack)})
    yield app
    runtime.current().close()


def pytest_report_header(config):
    return [f"real stack: Datastore emulator + memcached started by tests/conftest.py (pid {os.getpid()})"]
