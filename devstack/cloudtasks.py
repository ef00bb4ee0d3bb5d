"""A local Cloud Tasks: the Cloud Tasks API on loopback, delivering App Engine tasks to the app as Cloud Tasks does.

The app enqueues through `core.tasks.CloudTasksQueue` (google-cloud-tasks) here exactly as on App Engine; only its
gRPC channel points at this server (CLOUD_TASKS_EMULATOR_HOST). Tasks live in this process and in a SQLite file, never
in the app's processes, so a gunicorn worker that dies loses nothing it enqueued, and with a file under .devstack/ the
tasks outlive a restart of `make run` too.

What it does as Cloud Tasks does (sources beside each rule):
- CreateTask with a task id answers ALREADY_EXISTS for an id in use, and for one whose task ended (done, deleted or
  given up) within the dedup window: 9 days for a queue made from queue.yaml.
- Deliveries are POSTs to the app's URL + the task's relative_uri with App Engine's task headers
  (X-AppEngine-QueueName, -TaskName, -TaskRetryCount, -TaskExecutionCount, -TaskETA). A 2xx ends the task; anything
  else, or no answer, is retried after a backoff, until the queue's attempts are spent.
- queue.yaml's `rate` and `bucket_size` (a token bucket), `max_concurrent_requests`, and `retry_parameters`
  (`task_retry_limit`, `min_backoff_seconds`, `max_backoff_seconds`, `max_doublings`) are applied per queue.
- A task's schedule_time is honoured.
- cron.yaml's jobs are sent as App Engine's cron sends them: a GET of the job's url with X-Appengine-Cron: true, on
  its schedule (`every N minutes`; seconds too, locally); the mapper's sweep on MAPPER_SWEEP_SECONDS when set, the
  setting its schedule stands for (core/settings.py), so that a test sweeps every second.

What differs: Cloud Tasks trusts a delivery by App Engine's X-AppEngine-* headers, which App Engine strips from outside
requests; nothing strips them locally, so this server also sends the app's secret token (X-Tasks-Token), which the
task route checks off App Engine (core/tasks.py). So its API is not open to every local process either: each call
must carry that token (gRPC metadata x-tasks-token, core.tasks.local_channel), else UNAUTHENTICATED; Cloud Tasks
itself takes Google credentials. Only App Engine targets; no OIDC; one delivery at a time per task.

Run: `python -m devstack.cloudtasks --port P --target http://127.0.0.1:8080 [--store FILE] [--cron cron.yaml]`, the
token in TASKS_TOKEN.
"""
import argparse
import concurrent.futures
import dataclasses
import hmac
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import grpc
import requests
import yaml
from google.cloud import tasks_v2
from google.protobuf import timestamp_pb2

from core.settings import MAPPER_SWEEP_SECONDS, seconds_setting
from core.tasks import API_TOKEN_METADATA, MAX_TASK_BYTES, NAME_HEADER, QUEUE_HEADER, RETRY_HEADER, TOKEN_HEADER
from devstack.services import LOOPBACK, REPO, DevstackError, _die_with_parent, _terminate, _wait_listening, free_port

log = logging.getLogger("devstack.cloudtasks")

SERVICE = "google.cloud.tasks.v2.CloudTasks"
# "If a task's ID is identical to that of an existing task or a task that was deleted or executed recently then the
# call will fail with ALREADY_EXISTS. ... It can take up to 24 hours (or 9 days if the task's queue was created using a
# queue.yaml or queue.xml) for the task ID to be released" (CreateTaskRequest.task, google-cloud-tasks 2.26 and
# https://cloud.google.com/tasks/docs/reference/rpc/google.cloud.tasks.v2#createtaskrequest).
DEDUP_SECONDS = 9 * 86400
TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,500}")
PARENT = re.compile(r"projects/[^/]+/locations/[^/]+/queues/([A-Za-z0-9-]{1,100})")
DEADLINE = 600  # an App Engine standard task with automatic scaling has 10 minutes (creating-appengine-handlers)
USER_AGENT = "AppEngine-Google; (+http://code.google.com/appengine)"  # AppEngineHttpRequest.headers


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """One queue of queue.yaml, with Cloud Tasks' defaults where it is silent
    (https://cloud.google.com/appengine/docs/standard/reference/queueref)."""
    name: str
    rate: float = 5.0  # tasks per second
    bucket_size: int = 5
    max_concurrent: int = 1000
    max_attempts: int = -1  # task_retry_limit: "the same meaning" as RetryConfig.max_attempts; -1 unlimited
    min_backoff: float = 0.1
    max_backoff: float = 3600.0
    max_doublings: int = 16

    def backoff(self, retries):
        """Seconds before the attempt after `retries` failed ones: min_backoff doubled `max_doublings` times, then
        growing by that last step, capped at max_backoff (RetryConfig.max_doublings)."""
        doublings = min(retries - 1, self.max_doublings)
        step = self.min_backoff * 2 ** doublings
        return min(step + max(0, retries - 1 - self.max_doublings) * step, self.max_backoff)


def _rate(text):
    number, unit = str(text).split("/")
    return float(number) / {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def load_queues(path):
    """{name: QueueConfig} from a queue.yaml."""
    queues = {}
    for entry in (yaml.safe_load(path.read_text()) or {}).get("queue", []):
        retry = entry.get("retry_parameters", {})
        defaults = QueueConfig(entry["name"])
        queues[entry["name"]] = dataclasses.replace(
            defaults, rate=_rate(entry.get("rate", "5/s")), bucket_size=int(entry.get("bucket_size", 5)),
            max_concurrent=int(entry.get("max_concurrent_requests", defaults.max_concurrent)),
            max_attempts=int(retry.get("task_retry_limit", -1)),
            min_backoff=float(retry.get("min_backoff_seconds", defaults.min_backoff)),
            max_backoff=float(retry.get("max_backoff_seconds", defaults.max_backoff)),
            max_doublings=int(retry.get("max_doublings", defaults.max_doublings)))
    return queues


SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,        -- the full task name
    queue TEXT NOT NULL,
    uri TEXT NOT NULL,
    method TEXT NOT NULL,
    headers TEXT NOT NULL,        -- JSON
    body BLOB NOT NULL,
    eta REAL NOT NULL,            -- when it is due (epoch seconds)
    created REAL NOT NULL,
    retries INTEGER NOT NULL DEFAULT 0,     -- attempts made so far
    executions INTEGER NOT NULL DEFAULT 0,  -- attempts that got an answer from the app
    state TEXT NOT NULL DEFAULT 'queued',   -- queued | running | done | failed | deleted
    ended REAL                    -- when it left the queue: its id stays taken for DEDUP_SECONDS after
);
CREATE INDEX IF NOT EXISTS due ON tasks (queue, state, eta);
"""


@dataclasses.dataclass
class Row:
    name: str
    queue: str
    uri: str
    method: str
    headers: str
    body: bytes
    eta: float
    created: float
    retries: int
    executions: int
    state: str
    ended: float | None


class Store:
    """The tasks, in SQLite (one connection behind a lock: the server is small, its writes are few per delivery)."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SCHEMA)
            # A delivery in flight when the server stopped never finished: due again, as Cloud Tasks retries a
            # delivery whose answer it never got.
            self.db.execute("UPDATE tasks SET state = 'queued' WHERE state = 'running'")
            self.db.execute("DELETE FROM tasks WHERE ended < ?", (time.time() - DEDUP_SECONDS,))

    def _row(self, values):
        return Row(*values) if values else None

    def add(self, row):
        """False when the name is taken (a live task, or one that ended within the dedup window)."""
        with self.lock:
            taken = self.db.execute("SELECT ended FROM tasks WHERE name = ?", (row.name,)).fetchone()
            if taken and (taken[0] is None or taken[0] > time.time() - DEDUP_SECONDS):
                return False
            self.db.execute("INSERT OR REPLACE INTO tasks VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                            dataclasses.astuple(row))
            return True

    def get(self, name):
        with self.lock:
            return self._row(self.db.execute("SELECT * FROM tasks WHERE name = ?", (name,)).fetchone())

    def take_due(self, queue, now, limit):
        """Up to `limit` due tasks of `queue`, marked running, earliest first; and the next eta after them."""
        with self.lock:
            rows = [Row(*r) for r in self.db.execute(
                "SELECT * FROM tasks WHERE queue = ? AND state = 'queued' AND eta <= ? ORDER BY eta LIMIT ?",
                (queue, now, limit))]
            self.db.executemany("UPDATE tasks SET state = 'running' WHERE name = ?", [(r.name,) for r in rows])
            later = self.db.execute("SELECT MIN(eta) FROM tasks WHERE queue = ? AND state = 'queued'",
                                    (queue,)).fetchone()[0]
            return rows, later

    def finish(self, name, state, retries, executions, eta=None):
        with self.lock:
            ended = None if state == "queued" else time.time()
            self.db.execute("UPDATE tasks SET state = ?, retries = ?, executions = ?, eta = COALESCE(?, eta), "
                            "ended = ? WHERE name = ?", (state, retries, executions, eta, ended, name))

    def delete(self, name):
        """True if a queued task was deleted (its id stays taken, as in Cloud Tasks)."""
        with self.lock:
            cursor = self.db.execute("UPDATE tasks SET state = 'deleted', ended = ? WHERE name = ? AND state = "
                                     "'queued'", (time.time(), name))
            return cursor.rowcount == 1

    def counts(self):
        with self.lock:
            return dict(self.db.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall())


class Dispatcher:
    """Delivers one queue's due tasks: a token bucket of `rate` and `bucket_size`, at most `max_concurrent` in
    flight, failed attempts retried after the queue's backoff until its attempts are spent."""

    def __init__(self, config, store, target, token):
        self.config, self.store, self.target, self.token = config, store, target.rstrip("/"), token
        self.pool = concurrent.futures.ThreadPoolExecutor(min(config.max_concurrent, 64), thread_name_prefix="deliver")
        self.slots = threading.Semaphore(min(config.max_concurrent, 64))
        self.wake = threading.Event()
        self.stopping = False
        self.local = threading.local()
        self.thread = threading.Thread(target=self._loop, name=f"queue-{config.name}", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self):
        rate, bucket = self.config.rate, self.config.bucket_size
        tokens, refilled = float(bucket), time.monotonic()
        while not self.stopping:
            self.wake.clear()  # a wake after this (a new task, a delivery ended) cuts the wait below short
            now = time.monotonic()
            tokens, refilled = min(bucket, tokens + (now - refilled) * rate), now
            slots = 0
            while slots < int(tokens) and self.slots.acquire(blocking=False):
                slots += 1
            rows, later = self.store.take_due(self.config.name, time.time(), slots) if slots else ([], None)
            for _ in range(slots - len(rows)):
                self.slots.release()
            for row in rows:
                tokens -= 1
                self.pool.submit(self._deliver, row)
            if rows and len(rows) == slots:
                continue  # more may be due now: the bucket and the slots pace the next round
            if tokens < 1:
                wait = (1 - tokens) / rate  # until the bucket holds a token
            elif not slots:
                wait = 1.0  # every slot busy: until a delivery ends (it wakes this loop)
            else:
                wait = 1.0 if later is None else min(1.0, max(0.0, later - time.time()))
            self.wake.wait(wait)

    def _session(self):
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def _deliver(self, row):
        try:
            answered, ok = self._attempt(row)
            retries, executions = row.retries + 1, row.executions + answered
            if ok:
                self.store.finish(row.name, "done", retries, executions)
            elif 0 < self.config.max_attempts <= retries:
                log.error("task %s given up after %d attempts", row.name, retries)
                self.store.finish(row.name, "failed", retries, executions)
            else:
                self.store.finish(row.name, "queued", retries, executions,
                                  eta=time.time() + self.config.backoff(retries))
        except Exception:  # noqa: BLE001 - the dispatcher must outlive any one delivery
            log.exception("task %s: delivery broke; due again", row.name)
            self.store.finish(row.name, "queued", row.retries, row.executions, eta=time.time() + 1)
        finally:
            self.slots.release()
            self.wake.set()

    def _attempt(self, row):
        """(the app answered, it answered 2xx)."""
        task_id = row.name.rsplit("/", 1)[1]
        headers = {**json.loads(row.headers), "User-Agent": USER_AGENT, TOKEN_HEADER: self.token,
                   QUEUE_HEADER: self.config.name, NAME_HEADER: task_id, RETRY_HEADER: str(row.retries),
                   "X-AppEngine-TaskExecutionCount": str(row.executions),
                   "X-AppEngine-TaskETA": f"{row.eta:.6f}"}
        try:
            response = self._session().request(row.method, self.target + row.uri, data=row.body, headers=headers,
                                               timeout=(5, DEADLINE), allow_redirects=False)
        except requests.RequestException as e:
            log.warning("task %s not delivered: %s (attempt %d)", task_id, e, row.retries + 1)
            return False, False
        if not 200 <= response.status_code < 300:
            log.warning("task %s answered %s (attempt %d)", task_id, response.status_code, row.retries + 1)
        return True, 200 <= response.status_code < 300


# --- cron.yaml: App Engine's cron, locally ---------------------------------------------------------------------------

CRON_HEADER = "X-Appengine-Cron"
SCHEDULE = re.compile(r"every (\d+) (seconds|minutes|mins|hours)")
# A cron job whose schedule is a setting of the app: the setting, when set, is its interval here.
SCHEDULE_SETTINGS = {"/api/jobs/sweep": ("MAPPER_SWEEP_SECONDS", MAPPER_SWEEP_SECONDS)}


def load_cron(path, env=os.environ):
    """[(url, seconds)] from a cron.yaml (only `every N minutes|hours` schedules, and seconds, which App Engine
    refuses: its finest is a minute, https://cloud.google.com/appengine/docs/standard/reference/cron-yaml)."""
    jobs = []
    for entry in (yaml.safe_load(path.read_text()) or {}).get("cron", []):
        match = SCHEDULE.fullmatch(entry["schedule"].strip())
        if not match:
            raise ValueError(f"cron.yaml: only 'every N minutes' schedules are run locally, not {entry['schedule']!r}")
        seconds = int(match.group(1)) * {"seconds": 1, "minutes": 60, "mins": 60, "hours": 3600}[match.group(2)]
        if entry["url"] in SCHEDULE_SETTINGS:
            seconds = seconds_setting(env, *SCHEDULE_SETTINGS[entry["url"]])
        jobs.append((entry["url"], seconds))
    return jobs


class Cron:
    """Sends each cron job's GET on its schedule, the first one interval after the start, as App Engine does: one at
    a time per job, an answer waited for up to the task deadline; a failed one is not retried (the next is due)."""

    def __init__(self, jobs, target, token):
        self.jobs, self.target, self.token = jobs, target.rstrip("/"), token
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._every, args=job, name=f"cron-{job[0]}", daemon=True)
                        for job in jobs]

    def start(self):
        for thread in self.threads:
            thread.start()

    def stop(self):
        self.stopped.set()

    def _every(self, url, seconds):
        session = requests.Session()
        while not self.stopped.wait(seconds):
            try:
                response = session.get(self.target + url, headers={CRON_HEADER: "true", TOKEN_HEADER: self.token,
                                                                   "User-Agent": "AppEngine-Google; cron"},
                                       timeout=(5, DEADLINE))
                if response.status_code != 200:
                    log.warning("cron %s answered %s", url, response.status_code)
            except requests.RequestException as e:
                log.warning("cron %s not sent: %s", url, e)


def _timestamp(seconds):
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


class Server:
    """The API (gRPC, google.cloud.tasks.v2.CloudTasks: CreateTask, GetTask, DeleteTask) and a dispatcher per queue."""

    def __init__(self, port, target, token, queues, store_path=":memory:", cron=()):
        self.token = token
        self.cron = Cron(cron, target, token)
        self.store = Store(store_path)
        self.queues = queues
        self.dispatchers = {name: Dispatcher(config, self.store, target, token) for name, config in queues.items()}
        self.grpc = grpc.server(concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="api"))
        task, empty = tasks_v2.Task.serialize, lambda _: b""  # DeleteTask answers google.protobuf.Empty: no bytes
        methods = {"CreateTask": (tasks_v2.CreateTaskRequest, self._authenticated(self.create_task), task),
                   "GetTask": (tasks_v2.GetTaskRequest, self._authenticated(self.get_task), task),
                   "DeleteTask": (tasks_v2.DeleteTaskRequest, self._authenticated(self.delete_task), empty)}
        self.grpc.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=kind.deserialize,
                                                      response_serializer=serialize)
            for name, (kind, fn, serialize) in methods.items()}),))
        self.port = self.grpc.add_insecure_port(f"{LOOPBACK}:{port}")

    def start(self):
        for dispatcher in self.dispatchers.values():
            dispatcher.start()
        self.grpc.start()
        self.cron.start()
        return self

    def stop(self):
        self.cron.stop()
        self.grpc.stop(1)
        for dispatcher in self.dispatchers.values():
            dispatcher.stop()

    def _authenticated(self, method):
        """`method`, for callers that show the app's task token: this server adds it to every delivery, so a task
        from anyone else would reach the task route as the app's own (any local process can reach the port)."""
        expected = self.token.encode()

        def checked(request, context):
            given = dict(context.invocation_metadata()).get(API_TOKEN_METADATA, "")
            if not expected or not hmac.compare_digest(given.encode("utf-8", "replace"), expected):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "Calls need the app's task token "
                                                               f"({API_TOKEN_METADATA} metadata).")
            return method(request, context)
        return checked

    def _queue(self, parent, context):
        match = PARENT.fullmatch(parent)
        if not match or match.group(1) not in self.queues:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Queue {parent} does not exist (queue.yaml names "
                                                     f"{', '.join(self.queues)}).")
        return match.group(1)

    def create_task(self, request, context):
        queue = self._queue(request.parent, context)
        task = request.task
        http = task.app_engine_http_request
        if not http.relative_uri.startswith("/"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Only App Engine tasks with a relative_uri are served "
                                                            "locally.")
        name = task.name or f"{request.parent}/tasks/{uuid.uuid4().int % 10 ** 19}"
        if not name.startswith(request.parent + "/tasks/") or not TASK_ID.fullmatch(name.rsplit("/", 1)[1]):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Bad task name {name!r}.")
        if tasks_v2.Task.pb(task).ByteSize() > MAX_TASK_BYTES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Task size too large (over 100KB).")
        now = time.time()
        eta = task.schedule_time.timestamp() if task.schedule_time else now
        method = tasks_v2.HttpMethod(http.http_method or tasks_v2.HttpMethod.POST).name
        row = Row(name, queue, http.relative_uri, method, json.dumps(dict(http.headers)), bytes(http.body),
                  max(eta, now), now, 0, 0, "queued", None)
        if not self.store.add(row):
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "Requested entity already exists")
        self.dispatchers[queue].wake.set()
        return self._task(row)

    def get_task(self, request, context):
        row = self.store.get(request.name)
        if row is None or row.state not in ("queued", "running"):  # Cloud Tasks deletes a task once it ends
            context.abort(grpc.StatusCode.NOT_FOUND, "Requested entity was not found.")
        return self._task(row)

    def delete_task(self, request, context):
        if not self.store.delete(request.name):
            context.abort(grpc.StatusCode.NOT_FOUND, "Requested entity was not found.")

    @staticmethod
    def _task(row):
        return tasks_v2.Task(name=row.name, schedule_time=_timestamp(row.eta), create_time=_timestamp(row.created),
                             dispatch_count=row.retries, response_count=row.executions,
                             app_engine_http_request=tasks_v2.AppEngineHttpRequest(relative_uri=row.uri))


# --- the process: started by devstack (make run, the tests), stopped with them -------------------------------------

class LocalTasks:
    """This server as a process of its own on a loopback port, delivering to `target` with `token`; `store` a file
    that keeps the tasks across restarts (None: in memory, gone when it stops); `cron_yaml` its cron jobs (None:
    none); `env` added to its environment (the app's settings that a cron schedule stands for)."""

    name = "local Cloud Tasks"

    def __init__(self, target, token, store=None, port=None, queue_yaml=REPO / "queue.yaml", location="local",
                 cron_yaml=REPO / "cron.yaml", env=None):
        self.target, self.token, self.store, self.queue_yaml = target, token, store, queue_yaml
        self.cron_yaml, self.extra_env = cron_yaml, env or {}
        self.port = port or free_port()
        self.location = location
        self.proc = None

    @property
    def host(self):
        return f"{LOOPBACK}:{self.port}"

    def env(self):
        """What the app reads to enqueue here (core/settings.py)."""
        return self.env_at(self.port, self.location)

    @staticmethod
    def env_at(port, location="local"):
        """The same for a server that will listen on `port` (an app built before its server starts)."""
        return {"CLOUD_TASKS_EMULATOR_HOST": f"{LOOPBACK}:{port}", "TASKS_LOCATION": location}

    def start(self, timeout=30):
        command = [sys.executable, "-m", "devstack.cloudtasks", "--port", str(self.port), "--target", self.target,
                   "--queues", str(self.queue_yaml)]
        if self.store:
            command += ["--store", str(self.store)]
        if self.cron_yaml:
            command += ["--cron", str(self.cron_yaml)]
        self.proc = subprocess.Popen(command, env=dict(os.environ, **self.extra_env, TASKS_TOKEN=self.token), cwd=REPO,
                                     preexec_fn=_die_with_parent)
        try:
            _wait_listening(self.proc, self.port, timeout, f"the {self.name}")
        except DevstackError:
            self.stop()
            raise
        return self

    def stop(self):
        _terminate(self.proc, timeout=10)
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m devstack.cloudtasks", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True, help="the app's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--queues", default=str(REPO / "queue.yaml"))
    parser.add_argument("--store", default=":memory:", help="a SQLite file that keeps the tasks across restarts")
    parser.add_argument("--cron", help="a cron.yaml whose jobs to send on their schedules")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="cloudtasks: %(message)s")
    from pathlib import Path
    server = Server(args.port, args.target, os.environ.get("TASKS_TOKEN", ""), load_queues(Path(args.queues)),
                    args.store, load_cron(Path(args.cron)) if args.cron else ()).start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    server.stop()


if __name__ == "__main__":
    main()
