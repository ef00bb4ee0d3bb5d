"""What a process builds once and every request reuses: settings, the ndb client, the cache client, the task queue,
and the registries the features fill when the app is built. `create_app` keeps one `Runtime` on the app (`of(app)`);
each request makes it current (`RequestMiddleware`), and services reach it through `current()`, free of Flask. Nothing
here is process-wide: two apps in one process (the tests build several) each keep their own.
"""
import concurrent.futures
import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from google.cloud import ndb
from werkzeug.wsgi import ClosingIterator

from core import cache as cache_module
from core import costs, hotspots, production_latency
from core import datastore as datastore_module
from core import tasks as tasks_module
from core.settings import Settings

T = TypeVar("T")

_current: contextvars.ContextVar["Runtime"] = contextvars.ContextVar("runtime")
EXTENSION = "runtime"  # where create_app keeps an app's runtime


class Runtime:
    def __init__(self, settings: Settings | None = None, task_queue: tasks_module.Queue | None = None) -> None:
        self.settings = settings or Settings.from_env()
        # Where the backends differ is chosen here, once. Under a LATENCY profile every cache call and Cloud Tasks
        # call below waits first; Datastore RPCs wait in the stand-in (devstack/standin.py), and are counted here.
        self.latency = production_latency.Model(self.settings.latency, self.settings.latency_seed)
        self.cache_client = cache_module.make_client(self.settings)
        self.cache = cache_module.Cache(self.cache_client, self.latency)
        api = datastore_module.make_api(self.settings, self.latency)  # one channel for both uses of the Datastore API
        self.datastore = datastore_module.Datastore(
            datastore_module.make_client(self.settings, self.latency),
            datastore_module.Aggregations(self.settings, api),
            datastore_module.Bulk(self.settings, api),
            self.cache_client.global_cache(self.latency),
            datastore_module.ServerIncrements(self.settings, api) if self.settings.backend == "firestore" else None)
        self.hot_entities = hotspots.HotEntities(self.cache)
        # Each request's RPCs and cache calls counted (core/costs.py, Appstats). Always, but for bench/overhead.py's
        # app that measures what the counting itself costs.
        self.counting_costs = True
        self.tasks = tasks_module.TaskRouter(task_queue or tasks_module.make_queue(self.settings), self.latency)
        self._registries: dict[str, dict] = {}

    def registry(self, name: str) -> dict:
        """A dict the features fill while the app is built (e.g. the mapper's jobs by name), read by services."""
        return self._registries.setdefault(name, {})

    @contextlib.contextmanager
    def activated(self) -> Iterator["Runtime"]:
        """This runtime is `current()` inside the block (on this thread, in this context)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    @contextlib.contextmanager
    def context(self) -> Iterator[ndb.Context]:
        """Current, with a fresh ndb context: what one request, one worker thread or one script step runs in."""
        with self.activated(), self.datastore.context() as context:
            yield context

    @contextlib.contextmanager
    def cache_bypassed(self) -> Iterator[None]:
        """Inside the block, the request runs as on a deployment without a cache: the explicit calls are misses and
        no-ops, and ndb's global cache is off (a copy of the current ndb context without it). For reads only (make
        load's uncached front page): a write of a cached kind made here would leave the cache's old copy in place."""
        token = cache_module.BYPASSED.set(True)
        try:
            with ndb.get_context().new(global_cache=None).use():
                yield
        finally:
            cache_module.BYPASSED.reset(token)

    def in_context(self, fn: Callable[..., T]) -> Callable[..., T]:
        """`fn` wrapped to run in `context()` of its own, as one request does (for threads and scripts)."""
        def wrapped(*args: Any) -> T:
            with self.context():
                return fn(*args)
        return wrapped

    def map_in_threads(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
        """fn(item) for every item, all at once on threads of their own, each in its own ndb context; the results.
        A new thread starts with an empty context, so the caller's Cost is handed over: their calls count in it."""
        items = list(items)
        cost, in_context = costs.current(), self.in_context(fn)

        def counted(item: Any) -> T:
            with costs.measuring(cost):
                return in_context(item)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
            return list(pool.map(counted, items))

    def close(self) -> None:
        self.cache_client.close()


def of(app: Any) -> Runtime:
    """The runtime `create_app` built for `app` (kept in its extensions; this module never imports Flask)."""
    return app.extensions[EXTENSION]


def current() -> Runtime:
    """The runtime of the request (or script, or test) being served."""
    rt = _current.get(None)
    if rt is None:
        raise RuntimeError("no runtime is current: serve a request of an app, or use Runtime.activated()/context()")
    return rt


def cache() -> cache_module.Cache:
    return current().cache


def tasks() -> tasks_module.TaskRouter:
    return current().tasks


class RequestMiddleware:
    """WSGI middleware: every request runs with its app's runtime current, inside its own ndb context (one per
    request, as The Blue Alliance does), and with its cost counted (core/costs.py). Each chunk of the body, and
    `close()`, runs in the request's context again, as the view left it; between chunks nothing is left on the thread,
    so a server that reads the body late, or never closes it, cannot hand the thread's next request a context."""

    def __init__(self, wsgi_app: Callable, rt: Runtime) -> None:
        self.wsgi_app = wsgi_app
        self.runtime = rt

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        cost = costs.Cost() if self.runtime.counting_costs else None
        with costs.measuring(cost), self.runtime.context():
            body = self.wsgi_app(environ, start_response)
            request_context = contextvars.copy_context()

        def close() -> None:
            if hasattr(body, "close"):
                request_context.run(body.close)
        return ClosingIterator(_chunks_in(request_context, body), close)


def _chunks_in(request_context: contextvars.Context, body: Iterable[bytes]) -> Iterator[bytes]:
    chunks = request_context.run(iter, body)
    while (chunk := request_context.run(next, chunks, None)) is not None:
        yield chunk
