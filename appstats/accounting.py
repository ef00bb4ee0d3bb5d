"""The accounting's Flask side: every response gets its request's costs (core/costs.py counts them) in its
`Server-Timing` header and one log line, pages get them for their footer, and the process keeps the last ones for
/appstats. Installed on every app by create_app, whichever features it has.

It runs on every request, the cheapest included, so it does the least it can there (bench/overhead.py holds it to
3% of the cached front page): the header, one line written, and the request kept as it is. The figures /appstats
shows are worked out from it only when someone looks.
"""
import functools
import json
import re
import sys
import threading
import time
from typing import Any, NamedTuple

from flask import current_app, request
from werkzeug.wsgi import get_path_info

from core import clock, runtime
from core.costs import Cost, Recent, current

TRACE_HEADER = "X-Cloud-Trace-Context"  # TRACE_ID/SPAN_ID;o=1, set by App Engine's front end
TRACE_ENVIRON = "HTTP_X_CLOUD_TRACE_CONTEXT"
RECENT = 100  # requests kept per process for /appstats
TRACE_CONTEXT = re.compile(r"(?P<trace>[0-9a-f]{32})(?:/(?P<span>\d{1,20}))?(?:;o=(?P<options>[01]))?")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def init_app(app):
    """Bind the accounting to `app`: every response gets its Server-Timing header and one log line, and joins the
    process's recent requests; pages get `request_cost()` for their footer. Off with APPSTATS=off (no counting)."""
    recent = app.extensions["appstats"] = Recent(RECENT)
    app.add_template_global(_request_cost, "request_cost")
    app.after_request(_account)
    # a response given ahead of Flask (core.runtime.add_shortcut) is accounted for alike
    runtime.add_finisher(app, lambda environ, response: _bill(
        recent, environ["REQUEST_METHOD"], _full_path(environ), response, environ.get(TRACE_ENVIRON)))


def _cache_name(backend):
    """The cache as the footer and the log line say it: its backend, or just "cache" when there is none."""
    return backend if backend != "none" else "cache"


def _request_cost():
    cost = current()
    return cost.footer(_cache_name(runtime.current().cache.backend)) if cost is not None else None


class Served(NamedTuple):
    """One request as the accounting keeps it; `record()` is what /appstats shows of it."""
    method: str
    path: str
    status: int
    at: float  # seconds since the epoch (time.time(): a datetime is made only for /appstats)
    app_ms: float
    cost: Cost
    backend: str

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "status": self.status, "at": clock.iso_of(self.at),
                **self.cost.summary(self.backend, self.app_ms)}


def _account(response):
    _bill(current_app.extensions["appstats"], request.method, request.full_path.rstrip("?"), response,
          request.headers.get(TRACE_HEADER))
    return response


def _full_path(environ):
    """The path and query as Flask's request.full_path gives them (the path decoded), without a lone "?"."""
    query = environ.get("QUERY_STRING")
    return get_path_info(environ) + (f"?{query.encode('latin-1').decode(errors='replace')}" if query else "")


def _bill(recent, method, path, response, trace_header):
    """The response's Server-Timing header, its place among the recent requests, and its log line."""
    cost = current()
    if cost is None:
        return
    rt = runtime.current()
    app_ms = cost.elapsed_ms()
    response.headers["Server-Timing"] = cost.server_timing(app_ms)
    served = Served(method, path, response.status_code, time.time(), app_ms, cost, rt.cache.backend)
    recent.add(served)
    if rt.settings.on_app_engine:
        _write(json.dumps(_structured(served.record(), rt.settings.project, trace_header)), sys.stdout)
    else:
        _write(_readable(served), sys.stderr)


_writing = threading.Lock()


def _write(line, stream):
    """One log line, whole, to stdout or stderr, where App Engine's Cloud Logging reads each line as an entry (a JSON
    line is a structured entry: https://cloud.google.com/appengine/docs/standard/writing-application-logs). Straight
    to the stream, not through `logging`: its record (caller, thread, process) would cost more than the accounting
    itself, and the line needs none of it."""
    with _writing:  # the threads of a worker: one line at a time
        stream.write(line + "\n")
        stream.flush()


def _structured(record, project, trace_header):
    """One Cloud Logging entry (https://cloud.google.com/logging/docs/structured-logging): severity, message, the
    httpRequest, the figures, and the trace the request belongs to, so it sits under its request in Logs Explorer."""
    entry = {"severity": "INFO", "message": f"{record['method']} {record['path']} {record['status']}: "
                                            f"{record['datastore']['rpcs']} Datastore RPCs, "
                                            f"{record['billed']['reads']} reads, {record['billed']['writes']} writes, "
                                            f"{record['billed']['deletes']} deletes billed",
             "httpRequest": {"requestMethod": record["method"], "requestUrl": record["path"],
                             "status": record["status"], "latency": f"{record['app_ms'] / 1000:.4f}s"},
             "appstats": {k: v for k, v in record.items() if k not in ("method", "path", "status", "at")}}
    # The header comes with the request, and a client may send its own: only a well-formed one is used
    # (TRACE_ID/SPAN_ID;o=OPTIONS, https://cloud.google.com/trace/docs/trace-context#legacy-http-header).
    trace = TRACE_CONTEXT.fullmatch(trace_header or "")
    if trace:
        entry["logging.googleapis.com/trace"] = f"projects/{project}/traces/{trace['trace']}"
        if trace["span"] and 0 < int(trace["span"]) < 2 ** 64:
            # The header says the span in decimal; a LogEntry's spanId is 16 hex digits
            # (https://cloud.google.com/logging/docs/reference/v2/rest/v2/LogEntry; googleapis/python-logging#942).
            entry["logging.googleapis.com/spanId"] = f"{int(trace['span']):016x}"
        entry["logging.googleapis.com/trace_sampled"] = trace["options"] == "1"
    return entry


def _printable(text):
    """`text` with its control characters escaped: a path decoded from %0a must not start a line of its own."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@functools.lru_cache(maxsize=1024)
def _listed(counts):
    """'1 Lookup, 2 RunQuery' for ((name, n), ...), by name; 'none'. Once per process for each mix of calls."""
    return ", ".join(f"{n} {name}" for name, n in sorted(counts)) or "none"


def _readable(served):
    cost = served.cost
    by_method, by_call = _listed(tuple(cost.datastore.items())), _listed(tuple(cost.cache.items()))
    billed = cost.billed
    return (f"{_printable(served.method)} {_printable(served.path)} {served.status} {served.app_ms:.1f} ms | "
            f"datastore {cost.rpcs} RPCs {cost.datastore_s * 1000:.1f} ms ({by_method}) | "
            f"{_cache_name(served.backend)} {cost.cache_calls} calls {cost.cache_s * 1000:.1f} ms "
            f"({by_call}) | "
            f"billed {billed.reads} reads {billed.writes} writes {billed.deletes} deletes "
            f"${billed.usd_per_million():.2f}/M")
