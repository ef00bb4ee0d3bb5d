"""The accounting's Flask side: every response gets its request's costs (core/costs.py counts them) in its
`Server-Timing` header and one log line, pages get them for their footer, and the process keeps the last ones for
/appstats. Installed on every app by create_app, whichever features it has.

It runs on every request, the cheapest included, so it does the least it can there (bench/overhead.py holds it to
3% of the cached front page): the request formats its header, and leaves its figures to one thread of the process
(`Writer`), which keeps them for /appstats and writes the log lines of many requests at once. The figures /appstats
shows are worked out from them only when someone looks.
"""
import atexit
import collections
import contextlib
import functools
import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from typing import Any, NamedTuple

from markupsafe import Markup, escape
from werkzeug.wsgi import get_path_info

from core import clock, costs, runtime
from core.costs import CONTROL, Recent, Texts, current

log = logging.getLogger(__name__)
TRACE_ENVIRON = "HTTP_X_CLOUD_TRACE_CONTEXT"  # X-Cloud-Trace-Context: TRACE_ID/SPAN_ID;o=1, from App Engine
RECENT = 100  # requests kept per process for /appstats
TRACE_CONTEXT = re.compile(r"(?P<trace>[0-9a-f]{32})(?:/(?P<span>\d{1,20}))?(?:;o=(?P<options>[01]))?")


def init_app(app):
    """Bind the accounting to `app`: every response gets its Server-Timing header and one log line, and joins the
    process's recent requests; pages get `request_cost()` for their footer. Off with APPSTATS=off (no counting)."""
    settings = runtime.of(app).settings
    recent = app.extensions["appstats"] = RecentRequests(
        RECENT, runtime.of(app).cache.backend, settings.project if settings.on_app_engine else None)
    recent.modelled = runtime.of(app).latency.on
    app.add_template_global(functools.partial(_request_cost, recent.backend), "request_cost")
    app.add_template_global(recent.modelled, "latency_modelled")
    app.add_template_global(costs.plural)
    # every counted response, the app's and those given ahead of it (core.runtime.add_shortcut), as it starts
    runtime.account_responses(app, functools.partial(_bill, recent))


def _cache_name(backend):
    """The cache as the footer and the log line say it: its backend, or just "cache" when there is none."""
    return backend if backend != "none" else "cache"


def _request_cost(backend, encoded=False):
    """The footer of the request so far, as HTML: Markup (a template inserts it as it is), or its UTF-8 bytes when
    `encoded` (for a page kept as bytes: a Markup takes a Python call to make, a fifth of the footer's cost); None when
    nothing is counted. `backend`: the app's cache's."""
    cost = current()
    if cost is None:
        return None
    texts, datastore_ms, cache_ms, _ = cost.now()
    html = _footer_html(texts, backend) % (datastore_ms, cache_ms)
    if cost.waited_s:
        html += f"; {cost.waited_s * 1000:.1f} ms of it modelled production waits (LATENCY=production)"
    return html.encode() if encoded else Markup(html)


@functools.lru_cache(maxsize=1024)
def _footer_html(texts, backend):
    """The footer's template (costs.footer_template) escaped once: the times put in it need no escaping."""
    return str(escape(costs.footer_template(texts, _cache_name(backend))))


class Served(NamedTuple):
    """One request as the accounting keeps it; `record()` is what /appstats shows of it. A request leaves the same
    fields to the writer as a plain tuple (`_bill`: a NamedTuple takes a Python call to make), and the recent
    requests keep them so: a Served is made of one only when someone looks (/appstats, an App Engine log entry). Its
    figures are those its header said: the request's Cost goes with the request."""
    recent: "RecentRequests"  # its app's
    method: str
    path_info: str  # as WSGI gives it: decoded for the log line and /appstats only (`path`)
    query: str | None
    status: str  # the status line as the response started with it ("200 OK"): its code is read only when shown
    at: float  # seconds since the epoch (time.time(): a datetime is made only for /appstats)
    app_ms: float
    texts: Texts  # the texts of its calls, and their times, as its Server-Timing header said them
    datastore_ms: float
    cache_ms: float
    trace_header: str | None  # X-Cloud-Trace-Context, as it came

    @property
    def path(self) -> str:
        return _full_path(self.path_info, self.query)

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "status": int(self.status[:3]), "at": clock.iso_of(self.at),
                **self.texts.figures(self.recent.backend, round(self.datastore_ms, 1), round(self.cache_ms, 1),
                                     round(self.app_ms, 1))}


@functools.lru_cache(maxsize=256)
def _full_path(path_info, query):
    """The path and query as Flask's request.full_path gives them (the path decoded), without a lone "?"."""
    return (get_path_info({"PATH_INFO": path_info})
            + (f"?{query.encode('latin-1').decode(errors='replace')}" if query else ""))


def _bill(recent, cost, environ, start_response, status, headers, exc_info=None):
    """The response's Server-Timing header, added as it starts; the rest (its place among the recent requests, its log
    line) is left to the writer, LOG.

    The header joins the WSGI list as it is: Werkzeug's Headers.add would first scan the value for a line break with
    a regular expression, a fifth of this function's instructions (callgrind). The value is made of the app's own
    names (RPC methods, cache calls: core.costs.Texts checks them once) and of numbers, never of anything a request
    sent, and the server checks every header value again anyway (gunicorn's Response.process_headers:
    https://github.com/benoitc/gunicorn/blob/master/gunicorn/http/wsgi.py; Werkzeug's scan is `_str_header_value` in
    https://github.com/pallets/werkzeug/blob/main/src/werkzeug/datastructures/headers.py)."""
    texts, datastore_ms, cache_ms, app_ms = cost.now()
    timing = texts.server_timing % (datastore_ms, cache_ms, app_ms)
    if cost.retried:  # collisions: transactions tried again (core.transactions.transact)
        timing += f', retried;desc="{costs.plural(cost.retried, "transaction")} retried after a collision"'
    if recent.modelled:  # the production latency model's share of the times above
        timing += f', model;desc="LATENCY=production: modelled round trips";dur={cost.waited_s * 1000:.1f}'
    headers.append(("Server-Timing", timing))
    waiting = LOG.waiting  # LOG.add's work, without a Python call more for every request
    waiting.append((recent, environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING"),
                    status, time.time(), app_ms, texts, datastore_ms, cache_ms,
                    environ.get(TRACE_ENVIRON)))  # a Served's fields
    if not LOG.started or len(waiting) >= Writer.MOST:
        LOG.attend()
    return start_response(status, headers, exc_info)


class RecentRequests(Recent):
    """The last requests of an app in this process, for /appstats: those still waiting for the writer join first.
    With what its log lines say of the app: its cache, and its project when on App Engine (None: locally)."""

    def __init__(self, size, backend, project):
        super().__init__(size)
        self.backend, self.cache_name, self.project = backend, _cache_name(backend), project
        self.modelled = False  # under the production latency model (LATENCY=production)

    def items(self):
        LOG.flush()
        return [Served._make(served) for served in super().items()]


class Writer:
    """What the accounting does for a request once its response is on its way: the request joins its app's recent
    requests and gets its log line, one line to stderr (locally) or one JSON line to stdout (on App Engine), where
    Cloud Logging reads each line as an entry (a JSON line is a structured entry:
    https://cloud.google.com/appengine/docs/standard/writing-application-logs).

    A request only leaves its figures here; one thread of the process does the rest for every request that came in
    the last EVERY seconds, its lines in one write. Done by each request, the line and the record cost it more than
    the rest of the accounting, and the write a system call, with a hand-over of the GIL to another of the worker's
    threads (bench/overhead.py). Python's logging does the same for a web app with a QueueHandler
    (https://docs.python.org/3/howto/logging-cookbook.html#dealing-with-handlers-that-block), but with a LogRecord per
    line: its caller, thread and process would cost more than the accounting itself, and the line needs none of them.
    The price: a process killed outright (SIGKILL, out of memory) loses the lines of its last EVERY seconds; one that
    exits (gunicorn's graceful stop, App Engine's shutdown) writes them first. A JSON line carries the request's own
    time, so Cloud Logging dates it when it was served, not when it was written."""

    EVERY = 0.1  # seconds
    MOST = 1000  # requests waiting at most: past that, the request that adds one does the writer's work itself

    def __init__(self) -> None:
        self.waiting: collections.deque[tuple] = collections.deque()  # Served's fields; appended and popped
        # thread-safely
        self._writing = threading.Lock()
        self.started = False
        os.register_at_fork(after_in_child=self._forked)
        atexit.register(self.flush)

    def add(self, served: tuple) -> None:
        self.waiting.append(served)
        self.attend()

    def attend(self) -> None:
        """After requests were added: the writer started if this process has none yet, and its work done now when
        MOST requests wait."""
        if not self.started:
            self._start()
        if len(self.waiting) >= self.MOST:
            self.flush()

    def flush(self) -> None:
        """Every request waiting now joins its recent requests, and its line is written, in the order they came."""
        with self._writing:
            served_by_recent: dict[Recent, list[tuple]] = collections.defaultdict(list)
            lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
            for _ in range(len(self.waiting)):
                served = self.waiting.popleft()
                recent = served[0]
                served_by_recent[recent].append(served)
                if recent.project is None:  # the readable line, from the texts of its request line and its calls
                    _, method, path_info, query, status, _, app_ms, texts, datastore_ms, cache_ms, _ = served
                    lines["stderr"].append(_line_template(method, path_info, query, status, texts, recent.cache_name)
                                           % (app_ms, datastore_ms, cache_ms))
                else:
                    lines["stdout"].append(_structured(served))
            for recent, served_ones in served_by_recent.items():
                recent.add(*served_ones)
            for stream, written in lines.items():
                if written:
                    _write(getattr(sys, stream), "\n".join(written) + "\n")  # looked up now: a test may replace it

    def _start(self) -> None:
        with self._writing:
            if not self.started:
                self.started = True
                threading.Thread(target=self._write_every, name="accounting-writer", daemon=True).start()

    def _forked(self) -> None:
        """In a new process (a gunicorn worker forked from a master that had served): no writer yet, and a lock that
        may have been held by a thread the fork left behind."""
        self.started = False
        self._writing = threading.Lock()

    def _write_every(self) -> None:
        while True:
            time.sleep(self.EVERY)
            try:
                self.flush()
            except Exception:  # a line that could not be made: said, and the writer goes on
                log.exception("the accounting's writer failed")


def _write(stream, text):
    with contextlib.suppress(OSError, ValueError):  # a closed stream: nowhere left to say it
        stream.write(text)
        stream.flush()


LOG = Writer()


def _structured(served):
    """The request's Cloud Logging entry (https://cloud.google.com/logging/docs/structured-logging), one JSON line:
    its template (`_structured_template`), with this request's times and trace put in."""
    recent, method, path_info, query, status, at, app_ms, texts, datastore_ms, cache_ms, trace_header = served
    # The header comes with the request, and a client may send its own: only a well-formed one is used
    # (TRACE_ID/SPAN_ID;o=OPTIONS, https://cloud.google.com/trace/docs/trace-context#legacy-http-header).
    trace = TRACE_CONTEXT.fullmatch(trace_header or "")
    span = int(trace["span"]) if trace and trace["span"] else 0
    # The header says the span in decimal; a LogEntry's spanId is 16 hex digits
    # (https://cloud.google.com/logging/docs/reference/v2/rest/v2/LogEntry; googleapis/python-logging#942).
    shape = None if trace is None else "span" if 0 < span < 2 ** 64 else "trace"
    return _structured_template(method, path_info, query, status, texts, recent.backend, recent.project, shape) % {
        "seconds": int(at), "nanos": int(at % 1 * 1e9), "latency": app_ms / 1000, "datastore_ms": datastore_ms,
        "cache_ms": cache_ms, "app_ms": app_ms, "trace": trace and trace["trace"], "span": span,
        "sampled": "true" if trace and trace["options"] == "1" else "false"}


_SLOT = f"slot-{secrets.token_hex(8)}-"  # a slot's mark in a template's making: no request can spell it
_WHOLE_VALUES = {"seconds": "d", "nanos": "d", "datastore_ms": ".1f", "cache_ms": ".1f", "app_ms": ".1f",
                 "sampled": "s"}
_IN_TEXT = {"latency": ".4f", "trace": "s", "span": "016x"}


@functools.lru_cache(maxsize=1024)
def _structured_template(method, path_info, query, status, texts, backend, project, trace_shape):
    """The entry of every request with this request line, mix of calls and trace shape (None, "trace", "span"), as
    a %-template with a named slot for each time and for the trace: severity, message, the time it was served, the
    httpRequest, the figures, and the trace the request belongs to, so it sits under its request in Logs Explorer.
    Made by json.dumps once, with marks where the slots go; a request then only formats its numbers into it. An entry
    built and dumped for each request took five times the instructions (callgrind: 207,000 against 42,000), more
    than the rest of the accounting together."""
    def slot(name):
        return f"{_SLOT}{name}"
    path, status = _full_path(path_info, query), int(status[:3])
    billed = texts.billed
    entry = {"severity": "INFO",
             "message": f"{method} {path} {status}: {costs.plural(texts.rpcs, 'Datastore RPC')}, "
                        f"{billed.describe()} billed",
             # a special field: the entry's timestamp
             # (https://cloud.google.com/logging/docs/structured-logging#special-payload-fields)
             "timestamp": {"seconds": slot("seconds"), "nanos": slot("nanos")},
             "httpRequest": {"requestMethod": method, "requestUrl": path, "status": status,
                             "latency": slot("latency") + "s"},
             "appstats": texts.figures(backend, slot("datastore_ms"), slot("cache_ms"), slot("app_ms"))}
    if trace_shape is not None:
        entry["logging.googleapis.com/trace"] = f"projects/{project}/traces/{slot('trace')}"
        if trace_shape == "span":
            entry["logging.googleapis.com/spanId"] = slot("span")
        entry["logging.googleapis.com/trace_sampled"] = slot("sampled")
    text = json.dumps(entry).replace("%", "%%")
    for name, form in _WHOLE_VALUES.items():  # a number or true/false: the whole value, quotes and all
        text = text.replace(f'"{slot(name)}"', f"%({name}){form}")
    for name, form in _IN_TEXT.items():  # within a string
        text = text.replace(slot(name), f"%({name}){form}")
    return text


def _printable(text):
    """`text` with its control characters escaped: a path decoded from %0a must not start a line of its own."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@functools.lru_cache(maxsize=1024)
def _line_template(method, path_info, query, status, texts, cache_name):
    """The line of every request with this request line and mix of calls (core.costs.Texts), worked out once per
    process, with a slot (%.1f) for each time: the writer then only formats a request's three times into it."""
    head = f"{_printable(method)} {_printable(_full_path(path_info, query))} {status[:3]} "
    return head.replace("%", "%%") + _line_figures(texts, cache_name)


def _line_figures(texts, cache_name):
    """The line after its request line, for a mix of calls and its bill."""
    def listed(counts):  # '1 Lookup, 2 RunQuery', by name; 'none'; a fixed part of the format
        return (", ".join(f"{n} {name}" for name, n in sorted(counts)) or "none").replace("%", "%%")
    billed = texts.billed
    return (f"%.1f ms | datastore {costs.plural(texts.rpcs, 'RPC')} %.1f ms ({listed(texts.datastore)}) | "
            f"{cache_name} {costs.plural(texts.cache_calls, 'call')} %.1f ms ({listed(texts.cache)}) | "
            f"billed {billed.describe()} ${billed.usd_per_million():.2f}/M")

