"""What differs between the two backends, checked on both whichever one the suite runs on: server-side increments are
applied by Firestore in Datastore mode and never counted where the backend drops them (the legacy emulator)."""
import concurrent.futures
import uuid

import pytest
from google.api_core import exceptions as core_exceptions
from google.cloud import ndb

from core import runtime
from core.datastore import ServerIncrements
from counters.models import AppliedIncrement, CounterShard
from main import create_app
from tests.conftest import _settings


def _app(stack):
    namespace = f"t{uuid.uuid4().hex[:16]}"
    return create_app({"TESTING": True, "SETTINGS": _settings(stack, DATASTORE_NAMESPACE=namespace)})


def test_firestore_applies_server_increments_exactly_and_a_marker_makes_one_happen_once(firestore_stack):
    _app(firestore_stack)
    try:
        increments = runtime.current().datastore.increments
        assert isinstance(increments, ServerIncrements)
        with runtime.current().datastore.context():
            key = CounterShard.key_for("blind", 0)
            CounterShard(key=key, count=5).put()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                values = list(pool.map(lambda _: increments.commit(key, "count"), range(80)))
            assert sorted(values) == list(range(6, 86))  # each commit saw its own increment applied
            assert key.get(use_cache=False).count == 85
            marker = (AppliedIncrement.key_for("blind", "k1"), {"token": "mine", "created": "x"})
            assert increments.commit(key, "count", 1, insert=marker) == 86
            with pytest.raises(core_exceptions.AlreadyExists):
                increments.commit(key, "count", 1, insert=marker)
            assert key.get(use_cache=False).count == 86  # the refused commit wrote nothing
            assert AppliedIncrement.key_for("blind", "k1").get(use_cache=False).token == "mine"
    finally:
        runtime.current().close()


def test_an_increment_the_backend_drops_is_an_error_never_a_count(legacy_stack):
    app = _app(legacy_stack)
    try:
        assert runtime.current().datastore.increments is None  # the app never sends them to legacy
        increments = ServerIncrements(app.config["SETTINGS"])  # as if misconfigured
        with runtime.current().datastore.context():
            with pytest.raises(RuntimeError, match="did not apply a server-side increment"):
                increments.commit(ndb.Key(CounterShard, "dropped|0"), "count")
    finally:
        runtime.current().close()
