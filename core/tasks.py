"""Task dispatch: one interface, and one route every task arrives at, `/api/tasks/<name>` (core/views.py). A feature
registers its handlers by name in its `init_app` and enqueues named tasks. `CloudTasksQueue` speaks to Cloud Tasks on
App Engine, and under `make run` to devstack's local Cloud Tasks (devstack/cloudtasks.py), which keeps the tasks
outside the app's processes, so a worker that dies loses nothing it enqueued; most tests and the benchmarks hand
`create_app` a `devstack.taskqueue.DrainedQueue` and deliver through the same route. The task name makes enqueueing
idempotent. Handlers must be idempotent too: every queue delivers at least once, now and then twice at the same time.
"""
import collections
import contextlib
import datetime
import hashlib
import hmac
import json
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from core import costs
from core.production_latency import OFF, Model
from core.settings import Settings

if TYPE_CHECKING:
    from werkzeug.datastructures import Headers

ROUTE = "/api/tasks/{}"
TASK_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,400}")  # what Cloud Tasks accepts as a task id
# "The maximum task size is 100KB" (CreateTask, https://cloud.google.com/tasks/docs/reference/rpc/google.cloud.tasks.v2):
# no delivery's body is larger, so the task route takes no more (core/web.body_limit), and the local queue refuses a
# larger task as Cloud Tasks does (devstack/cloudtasks.py).
MAX_TASK_BYTES = 100 * 1024
TOKEN_HEADER = "X-Tasks-Token"
# What Cloud Tasks sends an App Engine task handler (https://cloud.google.com/tasks/docs/creating-appengine-handlers).
# App Engine replaces X-AppEngine-* headers on outside requests, so a request with the queue header came from a queue
# of this app. RetryCount counts the earlier deliveries, from 0.
QUEUE_HEADER = "X-AppEngine-QueueName"
RETRY_HEADER = "X-AppEngine-TaskRetryCount"
NAME_HEADER = "X-AppEngine-TaskName"
MAX_DELIVERIES = 10  # queue.yaml's task_retry_limit: deliveries (Cloud Tasks says attempts), the first included


def local_token(secret_key: str) -> str:
    """What a local queue shows the task route instead of App Engine's queue header: derived from the app's secret,
    so nobody outside the app can call the route."""
    return hmac.new(secret_key.encode(), b"tasks", hashlib.sha256).hexdigest()


API_TOKEN_METADATA = "x-tasks-token"  # gRPC metadata keys are lower case


def local_channel(host: str, token: str) -> Any:
    """A gRPC channel to devstack's local Cloud Tasks at `host`, every call carrying the app's task token: it takes
    tasks only from whoever holds the token already, not from any process that can reach a loopback port."""
    import grpc

    class WithToken(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            metadata = [*(details.metadata or ()), (API_TOKEN_METADATA, token)]
            return continuation(_CallDetails(details.method, details.timeout, metadata, details.credentials,
                                             details.wait_for_ready, details.compression), request)
    return grpc.intercept_channel(grpc.insecure_channel(host), WithToken())


class _CallDetails(collections.namedtuple(
        "_CallDetails", "method timeout metadata credentials wait_for_ready compression")):
    """grpc.ClientCallDetails with other metadata (grpc has no public constructor for one)."""


def is_from_queue(headers: "Mapping[str, str] | Headers", settings: Settings) -> bool:
    if settings.on_app_engine:
        return bool(headers.get(QUEUE_HEADER))
    # As bytes: compare_digest refuses a str with non-ASCII characters (a TypeError, a 500), and a header may hold any.
    given = headers.get(TOKEN_HEADER, "").encode("utf-8", "replace")
    return hmac.compare_digest(given, local_token(settings.secret_key).encode())


class Queue(Protocol):
    """What delivers the app's tasks: CloudTasksQueue (on App Engine and locally), a test's DrainedQueue, or NoQueue."""

    def enqueue(self, name: str, payload: dict, task_name: str, delay: float = 0) -> None: ...


class Task(collections.namedtuple("Task", "handler payload name delivery")):
    """A delivery: handler name, JSON payload, unique task name, and how many deliveries failed before this one."""

    def body(self) -> bytes:
        return json.dumps(self.payload, separators=(",", ":")).encode()


class TaskRouter:
    """The app's task handlers by name, and the queue that delivers to them. One per runtime: the features register
    their handlers while the app is built, never by being imported."""

    def __init__(self, queue: Queue, model: Model = OFF) -> None:
        self.queue = queue
        self.model = model  # under a LATENCY profile, creating a task and delivering it wait (production_latency)
        self._handlers: dict[str, Callable[[dict, int], object]] = {}

    def register(self, name: str, fn: Callable[[dict, int], object]) -> None:
        """fn(payload, delivery) handles the tasks named `name` (`delivery` counts from 0)."""
        if name in self._handlers:
            raise ValueError(f"a task handler is registered as {name!r} already")
        self._handlers[name] = fn

    def handler(self, name: str) -> Callable[[dict, int], object] | None:
        return self._handlers.get(name)

    def delivered(self) -> None:
        """A delivery has reached its handler: under a LATENCY profile, first the time it took to get here."""
        self.model.before_task_delivery(costs.current())

    def enqueue(self, name: str, payload: dict, task_name: str, delay: float = 0) -> None:
        """Enqueue once by `task_name` (a name used before is dropped), due in `delay` seconds."""
        if name not in self._handlers:
            raise ValueError(f"no task handler is registered as {name!r}")
        if not TASK_NAME_PATTERN.fullmatch(task_name):
            raise ValueError(f"bad task name {task_name!r}")
        self.model.before_task_create(costs.current())  # the CreateTask round trip, under a LATENCY profile
        self.queue.enqueue(name, payload, task_name, delay=delay)


class CloudTasksQueue:
    """Cloud Tasks, App Engine HTTP target; with `emulator_host`, devstack's local Cloud Tasks (local_channel)."""

    def __init__(self, project: str, location: str, queue: str, client: Any = None,
                 emulator_host: str | None = None, emulator_token: str = "") -> None:
        from google.cloud import tasks_v2  # only a process that enqueues needs it loaded
        self._tasks_v2 = tasks_v2
        self._client, self._emulator_host, self._lock = client, emulator_host, threading.Lock()
        self._emulator_token = emulator_token
        self.parent = tasks_v2.CloudTasksClient.queue_path(project, location, queue)

    @property
    def client(self) -> Any:
        """Built on first use, once per process: a process that never enqueues never looks for credentials."""
        if self._client is not None:  # every enqueue after the first: no lock
            return self._client
        with self._lock:
            if self._client is None:
                transport = None
                if self._emulator_host:
                    from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport
                    transport = CloudTasksGrpcTransport(
                        channel=local_channel(self._emulator_host, self._emulator_token))
                self._client = self._tasks_v2.CloudTasksClient(transport=transport)
            return self._client

    def enqueue(self, name: str, payload: dict, task_name: str, delay: float = 0) -> None:
        from google.api_core import exceptions
        task: dict[str, Any] = {
            "name": f"{self.parent}/tasks/{task_name}",
            "app_engine_http_request": {
                "http_method": self._tasks_v2.HttpMethod.POST,
                "relative_uri": ROUTE.format(name),
                "headers": {"Content-Type": "application/json"},
                "body": Task(name, payload, task_name, 0).body(),
            },
        }
        if delay:
            task["schedule_time"] = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delay)
        # AlreadyExists: the same named task was enqueued before (by a retry of the task that enqueues it): done.
        with contextlib.suppress(exceptions.AlreadyExists):
            self.client.create_task(parent=self.parent, task=task, timeout=30)


class NoQueue:
    """Off App Engine without a local Cloud Tasks: the app serves, but cannot enqueue (say how to get one)."""

    def enqueue(self, name: str, payload: dict, task_name: str, delay: float = 0) -> None:
        raise RuntimeError("No task queue: set CLOUD_TASKS_EMULATOR_HOST to a local Cloud Tasks "
                           "(`make run` starts one: devstack/cloudtasks.py).")


def make_queue(settings: Settings) -> Queue:
    # Settings.from_env names a location wherever there is a queue to reach (App Engine requires TASKS_LOCATION).
    if (settings.on_app_engine or settings.tasks_emulator_host) and settings.tasks_location:
        return CloudTasksQueue(settings.project, settings.tasks_location, settings.tasks_queue,
                               emulator_host=settings.tasks_emulator_host,
                               emulator_token=local_token(settings.secret_key) if settings.tasks_emulator_host else "")
    return NoQueue()
