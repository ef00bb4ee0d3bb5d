"""The real stack for the tests: one emulator (the legacy Datastore emulator in memory at consistency 1.0, or with
DATASTORE=firestore the Firestore emulator in Datastore mode) and one cache server per session (memcached, or with
CACHE=redis redis-server), started here on free loopback ports and stopped at the end. Every test starts from an empty
datastore (reset, or a namespace of its own) and an empty cache. What the fixtures are built from is in
tests/support.py.

Nothing here, or in any test, stands in for Datastore or the cache: fault tests stop or freeze the real processes.
"""
import os

import pytest

from core import runtime
from devstack import Stack
from devstack.services import backend_from_env, cache_from_env
from tests.support import Auth, Tasks, make_app, running


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
    with running(make_app(stack, **stack.fresh()), flush=True) as app:
        yield app


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def ndb_context(app):
    """Service-level tests run inside an ndb context, as a request would."""
    with runtime.of(app).context():
        yield


@pytest.fixture
def task_queue(app):
    return Tasks(app)


@pytest.fixture
def auth(client):
    return Auth(client)


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
    with running(make_app(legacy_stack, checked=False, **legacy_stack.fresh())) as app:
        yield app


@pytest.fixture
def weak_stack():
    """A legacy emulator at its default consistency (0.9), for code that claims strong consistency: only the legacy
    emulator can lag (Firestore in Datastore mode is strongly consistent), so this is one under either backend."""
    with Stack(consistency=0.9) as s:
        yield s


@pytest.fixture
def weak_app(weak_stack):
    with running(make_app(weak_stack)) as app:
        yield app


def pytest_report_header(config):
    return [f"real stack: {backend_from_env()} Datastore emulator + {cache_from_env()} started by tests/conftest.py "
            f"(pid {os.getpid()})"]
