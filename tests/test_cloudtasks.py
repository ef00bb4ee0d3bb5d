"""devstack's local Cloud Tasks (devstack/cloudtasks.py) on its own: the API as google-cloud-tasks speaks it, the
headers App Engine task handlers get, queue.yaml's retries, rate and concurrency, names kept after a task ends, and
tasks kept across a restart. Its deliveries go to a small WSGI app on loopback that notes what it is sent."""
import threading
import time

import grpc
import pytest
import yaml
from google.api_core import exceptions
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport
from werkzeug.datastructures import Headers
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from core import tasks
from devstack.cloudtasks import LocalTasks, QueueConfig, load_queues
from devstack.services import REPO, free_port
from devstack.serving import wait_until

TOKEN = "local-token"


class Target:
    """The app stand-in tasks are delivered to: notes each delivery (its time and headers) and answers `status(n)`
    to the n-th delivery of a task id."""

    def __init__(self, status=lambda n: 200, hold=0.0):
        self.deliveries, self.lock = [], threading.Lock()
        self.status, self.hold, self.in_flight, self.most = status, hold, 0, 0
        self.port = free_port()
        self.server = make_server("127.0.0.1", self.port, self.wsgi, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    @Request.application
    def wsgi(self, request):
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            name = request.headers.get(tasks.NAME_HEADER)
            n = sum(1 for d in self.deliveries if d["name"] == name)
            self.deliveries.append({"name": name, "at": time.monotonic(), "headers": Headers(request.headers),
                                    "body": request.get_data(), "path": request.path})
        time.sleep(self.hold)
        with self.lock:
            self.in_flight -= 1
        return Response("ok", status=self.status(n))

    def of(self, name):
        with self.lock:
            return [d for d in self.deliveries if d["name"] == name]

    def stop(self):
        self.server.shutdown()


def _queue_yaml(tmp_path, **queue):
    path = tmp_path / "queue.yaml"
    path.write_text(yaml.safe_dump({"queue": [{"name": "q", **queue}]}))
    return path


@pytest.fixture
def target():
    target = Target()
    yield target
    target.stop()


def _client(server, token=TOKEN):
    channel = tasks.local_channel(server.host, token) if token is not None else grpc.insecure_channel(server.host)
    return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))


def _queue(server, name="q"):
    return tasks.CloudTasksQueue("p", "local", name, emulator_host=server.host, emulator_token=TOKEN)


def test_queue_yaml_is_read_as_cloud_tasks_reads_it():
    mapper = load_queues(REPO / "queue.yaml")["mapper"]
    assert (mapper.rate, mapper.bucket_size, mapper.max_concurrent) == (50.0, 50, 32)
    assert (mapper.max_attempts, mapper.min_backoff, mapper.max_backoff) == (tasks.MAX_DELIVERIES, 0.1, 10.0)
    # min_backoff doubled after each failed attempt, up to max_backoff; linear after max_doublings doublings
    assert [mapper.backoff(n) for n in (1, 2, 3, 4, 8)] == [0.1, 0.2, 0.4, 0.8, 10.0]
    linear = QueueConfig("l", min_backoff=1, max_backoff=100, max_doublings=2)
    assert [linear.backoff(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 12]


def test_a_task_is_delivered_with_app_engine_headers_and_its_name_stays_taken(tmp_path, target):
    with LocalTasks(target.url, TOKEN, queue_yaml=_queue_yaml(tmp_path, rate="50/s")) as server:
        queue = _queue(server)
        queue.enqueue("accounts.seed", {"n": 1}, "t-1")
        queue.enqueue("accounts.seed", {"n": 1}, "t-1")  # ALREADY_EXISTS while it waits: one task
        wait_until(lambda: target.of("t-1"), "the delivery")
        time.sleep(0.3)
        queue.enqueue("accounts.seed", {"n": 1}, "t-1")  # and after it ran: the name stays taken (9 days)
        time.sleep(0.5)
        [delivery] = target.of("t-1")
        headers = delivery["headers"]
        assert delivery["path"] == "/api/tasks/accounts.seed" and delivery["body"] == b'{"n":1}'
        assert headers[tasks.QUEUE_HEADER] == "q" and headers[tasks.RETRY_HEADER] == "0"
        assert headers["X-AppEngine-TaskExecutionCount"] == "0" and headers[tasks.TOKEN_HEADER] == TOKEN
        assert headers["Content-Type"] == "application/json"
        # a deleted task's name stays taken too, and it is never delivered
        client = _client(server)
        later = tasks_v2.Task(name=f"{queue.parent}/tasks/t-2", schedule_time={"seconds": int(time.time()) + 60},
                              app_engine_http_request={"relative_uri": "/api/tasks/x"})
        client.create_task(parent=queue.parent, task=later)
        client.delete_task(name=later.name)
        with pytest.raises(exceptions.AlreadyExists):
            client.create_task(parent=queue.parent, task=later)
        with pytest.raises(exceptions.NotFound):
            client.create_task(parent=queue.parent.replace("/q", "/nope"), task={"app_engine_http_request": {
                "relative_uri": "/x"}})
        with pytest.raises(exceptions.InvalidArgument):
            client.create_task(parent=queue.parent, task={"http_request": {"url": "http://example.com/"}})


@pytest.mark.parametrize("token", [None, "", "not-the-token", TOKEN + "x"])
def test_only_the_app_may_call_the_api(tmp_path, target, token):
    """The server adds the app's task token to every delivery: a task from any other local process would reach the
    task route as the app's own, so calls without the token are refused and nothing is queued or delivered."""
    with LocalTasks(target.url, TOKEN, queue_yaml=_queue_yaml(tmp_path, rate="50/s")) as server:
        intruder, parent = _client(server, token), _queue(server).parent
        with pytest.raises(exceptions.Unauthenticated):
            intruder.create_task(parent=parent, task={"name": f"{parent}/tasks/forged", "app_engine_http_request": {
                "relative_uri": "/api/tasks/accounts.seed", "body": b'{"seed":"x","start":0,"stop":1000000000}'}})
        with pytest.raises(exceptions.Unauthenticated):
            intruder.get_task(name=f"{parent}/tasks/forged")
        with pytest.raises(exceptions.Unauthenticated):
            intruder.delete_task(name=f"{parent}/tasks/forged")
        time.sleep(0.3)
        assert target.deliveries == []
        with pytest.raises(exceptions.NotFound):  # nothing was queued
            _client(server).get_task(name=f"{parent}/tasks/forged")


def test_failed_deliveries_are_retried_with_backoff_until_the_attempts_are_spent(tmp_path):
    target = Target(status=lambda n: 500 if n < 2 else 200)
    config = {"rate": "50/s", "retry_parameters": {"task_retry_limit": 3, "min_backoff_seconds": 0.3,
                                                   "max_backoff_seconds": 0.6}}
    try:
        with LocalTasks(target.url, TOKEN, queue_yaml=_queue_yaml(tmp_path, **config)) as server:
            queue = _queue(server)
            queue.enqueue("h", {}, "third-time-lucky")
            wait_until(lambda: len(target.of("third-time-lucky")) == 3, "three attempts")
            attempts = target.of("third-time-lucky")
            assert [d["headers"][tasks.RETRY_HEADER] for d in attempts] == ["0", "1", "2"]
            gaps = [b["at"] - a["at"] for a, b in zip(attempts, attempts[1:], strict=False)]
            # 0.3 s, then doubled to 0.6 s. Lower bounds only, upper ones loose: a loaded machine delays, never hastens.
            assert 0.28 <= gaps[0] < 3 and 0.58 <= gaps[1] < 3, gaps
            target.status = lambda n: 503
            queue.enqueue("h", {}, "never")
            wait_until(lambda: len(target.of("never")) == 3, "three attempts")
            time.sleep(1.0)
            assert len(target.of("never")) == 3  # task_retry_limit 3: given up
            with pytest.raises(exceptions.NotFound):
                _client(server).get_task(name=f"{queue.parent}/tasks/never")
    finally:
        target.stop()


def test_rate_bucket_and_concurrency_are_honoured(tmp_path):
    target = Target(hold=0.1)
    try:
        config = {"rate": "10/s", "bucket_size": 3, "max_concurrent_requests": 2}
        with LocalTasks(target.url, TOKEN, queue_yaml=_queue_yaml(tmp_path, **config)) as server:
            queue = _queue(server)
            for i in range(13):
                queue.enqueue("h", {}, f"r-{i}")
            wait_until(lambda: len(target.deliveries) == 13, "13 deliveries", timeout=20)
        starts = sorted(d["at"] for d in target.deliveries)
        assert target.most <= 2  # max_concurrent_requests
        # a bucket of 3 and then 10 a second: the 13th no sooner than 1 s after the first
        assert starts[-1] - starts[0] >= 0.9, starts[-1] - starts[0]
    finally:
        target.stop()


def test_tasks_wait_for_their_time_and_outlive_a_restart_of_the_server(tmp_path):
    target = Target()
    store = tmp_path / "tasks.sqlite3"
    try:
        down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every attempt fails
        with LocalTasks(down, TOKEN, store=store, queue_yaml=_queue_yaml(tmp_path, rate="50/s")) as server:
            queue = _queue(server)
            queue.enqueue("h", {"n": 1}, "kept")
            enqueued = time.monotonic()
            queue.enqueue("h", {"n": 2}, "later", delay=2)
            time.sleep(0.5)
        with LocalTasks(target.url, TOKEN, store=store, queue_yaml=_queue_yaml(tmp_path, rate="50/s")) as server:
            wait_until(lambda: target.of("kept") and target.of("later"), "both tasks after the restart")
            assert int(target.of("kept")[0]["headers"][tasks.RETRY_HEADER]) >= 1  # its failed attempts counted
            # Not before its schedule_time, however long the stop and the start took (CI once spent 1.3 s in them).
            assert target.of("later")[0]["at"] - enqueued >= 1.9
            with pytest.raises(exceptions.AlreadyExists):  # names survive the restart with the tasks
                _client(server).create_task(parent=_queue(server).parent, task={
                    "name": f"{_queue(server).parent}/tasks/kept", "app_engine_http_request": {"relative_uri": "/x"}})
    finally:
        target.stop()
