"""Task dispatch: one interface, three backends, one route every task arrives at.

A feature registers its handlers by name when the app is built (`runtime.tasks.register("mapper.run", fn)` in its
`init_app`) and enqueues named tasks (`runtime.current().tasks.enqueue(name, payload, task_name)`). Every backend
delivers a task as an HTTP POST of its JSON payload to `/api/tasks/<name>` (core/views.py), so the code a task runs is
the same everywhere:

- `CloudTasksQueue` on App Engine: google-cloud-tasks with an App Engine HTTP target. The task name makes enqueueing
  idempotent (ALREADY_EXISTS is success), and Cloud Tasks retries a delivery until it answers 2xx.
- `HttpQueue` locally (`make run`): threads in this process POST to the app's own URL, retry with backoff, and drop a
  name already enqueued (memcached `add` across processes, a set within one).
- in tests and benchmarks, `devstack.taskqueue.DrainedQueue`, handed to `create_app`: tasks wait in a list until the
  test delivers them through the same route, one at a time or on threads.

Handlers must be idempotent: every backend delivers at least once, and twice at the same time now and then.
"""
import collections
import contextlib
import hashlib
import hmac
import json
import logging
import queue
import re
import threading
import time

import requests

log = logging.getLogger(__name__)

ROUTE = "/api/tasks/{}"
TASK_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,400}")  # what Cloud Tasks accepts as a task id
TOKEN_HEADER = "X-Tasks-Token"
# Cloud Tasks sets these on an App Engine delivery, and App Engine strips X-AppEngine-* from outside requests,
# so a request carrying the queue header came from a queue of this app.
QUEUE_HEADER = "X-AppEngine-QueueName"
RETRY_HEADER = "X-CloudTasks-TaskRetryCount"
NAME_HEADER = "X-CloudTasks-TaskName"
MAX_ATTEMPTS = 10  # the local queues' give-up point; queue.yaml sets the same for Cloud Tasks

def local_token(secret_key):
    """What a local queue shows the task route instead of App Engine's queue header: derived from the app's secret,
    so nobody outside the app can call the route."""
    return hmac.new(secret_key.encode(), b"tasks", hashlib.sha256).hexdigest()


def local_headers(token, task):
    """The headers a local queue delivers `task` with: the token, and Cloud Tasks' retry count and name headers."""
    return {"Content-Type": "application/json", TOKEN_HEADER: token, RETRY_HEADER: str(task.attempt),
            NAME_HEADER: task.name}


def is_from_queue(headers, settings):
    if settings.on_app_engine:
        return bool(headers.get(QUEUE_HEADER))
    return hmac.compare_digest(headers.get(TOKEN_HEADER, ""), local_token(settings.secret_key))


class Task(collections.namedtuple("Task", "handler payload name attempt")):
    """A delivery: handler name, JSON payload, unique task name, and how many deliveries failed before this one."""

    def body(self):
        return json.dumps(self.payload, separators=(",", ":")).encode()


class TaskRouter:
    """The app's task handlers by name, and the queue that delivers to them. One per runtime: the features register
    their handlers while the app is built, never by being imported."""

    def __init__(self, queue):
        self.queue = queue
        self._handlers = {}

    def register(self, name, fn):
        """fn(payload, attempt) handles the tasks named `name` (attempt counts from 0)."""
        if name in self._handlers:
            raise ValueError(f"a task handler is registered as {name!r} already")
        self._handlers[name] = fn

    def handler(self, name):
        return self._handlers.get(name)

    def enqueue(self, name, payload, task_name):
        if name not in self._handlers:
            raise ValueError(f"no task handler is registered as {name!r}")
        if not TASK_NAME_PATTERN.fullmatch(task_name):
            raise ValueError(f"bad task name {task_name!r}")
        self.queue.enqueue(name, payload, task_name)

    def wait(self):
        """Until every task enqueued so far has been delivered or given up (for tests and scripts)."""
        self.queue.wait()


class CloudTasksQueue:
    """Cloud Tasks, App Engine HTTP target; the client (a gRPC channel) is built once per process."""

    def __init__(self, project, location, queue, client=None):
        from google.cloud import tasks_v2  # only App Engine needs it loaded
        self._tasks_v2 = tasks_v2
        self.client = client or tasks_v2.CloudTasksClient()
        self.parent = self.client.queue_path(project, location, queue)

    def enqueue(self, name, payload, task_name):
        from google.api_core import exceptions
        task = {
            "name": f"{self.parent}/tasks/{task_name}",
            "app_engine_http_request": {
                "http_method": self._tasks_v2.HttpMethod.POST,
                "relative_uri": ROUTE.format(name),
                "headers": {"Content-Type": "application/json"},
                "body": Task(name, payload, task_name, 0).body(),
            },
        }
        # AlreadyExists: the same named task was enqueued before (by a retry of the task that enqueues it): done.
        with contextlib.suppress(exceptions.AlreadyExists):
            self.client.create_task(parent=self.parent, task=task)

    def wait(self):
        """Cloud Tasks delivers on its own schedule: nothing here to wait for."""


class HttpQueue:
    """The local stand-in for Cloud Tasks: delivers to the app's own URL from a few threads in this process.

    Tasks live only in memory, on daemon threads: a task still waiting when the process stops is lost (Cloud Tasks
    keeps them), and stopping `make run` never waits for deliveries to a server that is going away.
    """

    def __init__(self, base_url, token, cache=None, workers=8, max_attempts=MAX_ATTEMPTS, base=0.1, cap=10.0):
        self.base_url, self.token, self.cache = base_url.rstrip("/"), token, cache
        self.max_attempts, self.base, self.cap = max_attempts, base, cap
        self.workers = workers
        self.session = requests.Session()
        self._seen, self._lock, self._work, self._threads = set(), threading.Lock(), queue.Queue(), []

    def _first_time(self, task_name):
        with self._lock:
            if task_name in self._seen:
                return False
            self._seen.add(task_name)
        # Another gunicorn worker may have enqueued it; memcached down or not, this process never sends it twice.
        return self.cache is None or self.cache.claim(f"task-name:{task_name}", expire=3600)

    def enqueue(self, name, payload, task_name):
        if self._first_time(task_name):
            with self._lock:
                while len(self._threads) < self.workers:  # started on first use: no threads in processes that never
                    thread = threading.Thread(target=self._worker, daemon=True, name="tasks")  # enqueue
                    thread.start()
                    self._threads.append(thread)
            self._work.put(Task(name, payload, task_name, 0))

    def wait(self):
        """Until every task enqueued so far has been delivered or given up (for tests and scripts)."""
        self._work.join()

    def _worker(self):
        while True:
            task = self._work.get()
            try:
                self._deliver(task)
            finally:
                self._work.task_done()

    def _deliver(self, task):
        for attempt in range(self.max_attempts):
            try:
                response = self.session.post(self.base_url + ROUTE.format(task.handler), data=task.body(),
                                             headers=local_headers(self.token, task._replace(attempt=attempt)),
                                             timeout=60)
                if 200 <= response.status_code < 300:
                    return
                log.warning("task %s answered %s (attempt %d)", task.name, response.status_code, attempt + 1)
            except requests.RequestException as e:
                log.warning("task %s not delivered: %s (attempt %d)", task.name, e, attempt + 1)
            time.sleep(min(self.base * 2 ** attempt, self.cap))
        log.error("task %s given up after %d attempts", task.name, self.max_attempts)


def make_queue(settings, cache):
    if settings.tasks_backend == "cloud-tasks":
        return CloudTasksQueue(settings.project, settings.tasks_location, settings.tasks_queue)
    return HttpQueue(settings.tasks_url, local_token(settings.secret_key), cache)
