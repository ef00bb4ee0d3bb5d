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
from tests.support import running, settings_for


def _app(stack):
    namespace = f"t{uuid.uuid4().hex[:16]}"
    return create_app({"TESTING": True, "SETTINGS": settings_for(stack, DATASTORE_NAMESPACE=namespace)})


def test_firestore_applies_server_increments_exactly_and_a_marker_makes_one_happen_once(firestore_stack):
    with running(_app(firestore_stack)):
        increments = runtime.current().datastore.increments
        assert isinstance(increments, ServerIncrements)
        with runtime.current().context():
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


def test_an_increment_the_backend_drops_is_an_error_never_a_count(legacy_stack):
    with running(_app(legacy_stack)):
        assert runtime.current().datastore.increments is None  # the app never sends them to legacy
        increments = ServerIncrements(runtime.current().settings)  # as if misconfigured
        with runtime.current().context(), pytest.raises(RuntimeError, match="did not apply a server-side increment"):
            increments.commit(ndb.Key(CounterShard, "dropped|0"), "count")
