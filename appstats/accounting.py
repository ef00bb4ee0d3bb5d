"""The accounting's Flask side: every response gets its request's costs in its `Server-Timing` header, pages in their
footer, and each request one log line and a capture for /appstats (captures.py)."""
import json
import logging
import os
import re
import sys
import time
from typing import Any

from flask import Flask, Response, request
from markupsafe import Markup, escape

from appstats import captures
from core import billing, clock, costs, runtime

# App Engine's X-Cloud-Trace-Context, TRACE_ID/SPAN_ID;o=OPTIONS (https://cloud.google.com/trace/docs/trace-context).
# A client may send its own: only a well-formed one is used.
TRACE_CONTEXT = re.compile(r"(?P<trace>[0-9a-f]{32})(?:/(?P<span>\d{1,20}))?(?:;o=(?P<options>[01]))?")


def _lines(name: str, stream: Any) -> logging.Logger:
    """A logger that writes each message as it is (a handler's default format), not among the app's other logs."""
    logger = logging.getLogger(name)
    logger.addHandler(logging.StreamHandler(stream))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


# Locally a readable line on stderr; on App Engine a JSON line on stdout, which Cloud Logging reads as a structured
# entry (https://cloud.google.com/logging/docs/structured-logging).
LOCAL_LINES = _lines("appstats.local", sys.stderr)
CLOUD_LINES = _lines("appstats.cloud", sys.stdout)


def init_app(app: Flask) -> None:
    """Nothing here runs for a request without a cost (Runtime.counting_costs off: bench/overhead.py)."""
    rt = runtime.of(app)
    backend, project = rt.cache.backend, rt.settings.project if rt.settings.on_app_engine else None
    cache_name = backend if backend != "none" else "cache"

    def request_cost() -> Markup | None:
        """The footer's figures for the request so far, or None when nothing is counted."""
        cost = costs.current()
        return None if cost is None else Markup(escape(cost.footer(cache_name)))

    @app.after_request
    def account(response: Response) -> Response:
        cost = costs.current()
        if cost is None:
            return response
        cost.end()
        response.headers["Server-Timing"] = cost.server_timing()
        served = time.time()
        # its process: the instance's last 8 characters and the pid (read per request: a gunicorn worker forks later)
        process = f"{os.environ.get('GAE_INSTANCE', 'local')[-8:]}/{os.getpid()}"
        capture = {"method": request.method, "path": _path(), "status": response.status_code,
                   "at": clock.iso_of(served), "process": process, **cost.figures(backend)}
        if request.endpoint != "static":  # static files' answers (mostly 304s) would crowd the requests out
            captures.keep(rt.cache, capture, cost.kept_calls())
        if project is None:
            LOCAL_LINES.info(_line(capture, cost.billed, cache_name))
        else:
            CLOUD_LINES.info(json.dumps(_entry(capture, cost.billed, served, project)))
        return response

    app.add_template_global(request_cost)
    app.jinja_env.globals["latency_modelled"] = rt.latency.on
    app.add_template_global(costs.plural)


def _path() -> str:
    """The path (decoded) and query string, as the client sent them, without a lone "?"."""
    query = request.query_string.decode(errors="replace")
    return request.path + (f"?{query}" if query else "")


def _printable(text: str) -> str:
    """`text` with its control characters escaped: a path decoded from %0a must not start a log line of its own."""
    return costs.CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _line(capture: dict[str, Any], billed: billing.Billed, cache_name: str) -> str:
    """'GET /blog/demo 200 5.1 ms | datastore 1 RPC 2.0 ms (1 Lookup) | memcached 2 calls 0.4 ms (2 get_many) |
    billed 1 read $0.30/M'."""
    def listed(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {name}" for name, n in sorted(counts.items())) or "none"
    datastore, cache = capture["datastore"], capture["cache"]
    return (f"{_printable(capture['method'])} {_printable(capture['path'])} {capture['status']} "
            f"{capture['app_ms']:.1f} ms | datastore {costs.plural(datastore['rpcs'], 'RPC')} {datastore['ms']:.1f} ms "
            f"({listed(datastore['by_method'])}) | "
            f"{cache_name} {costs.plural(cache['calls'], 'call')} {cache['ms']:.1f} ms ({listed(cache['by_call'])}) | "
            f"billed {billed.describe()} ${billed.usd_per_million():.2f}/M")


def _entry(capture: dict[str, Any], billed: billing.Billed, served: float, project: str) -> dict[str, Any]:
    """The request's Cloud Logging entry, with the trace it belongs to, so that it sits under its request in Logs
    Explorer (https://cloud.google.com/logging/docs/structured-logging#special-payload-fields)."""
    message = (f"{capture['method']} {capture['path']} {capture['status']}: "
               f"{costs.plural(capture['datastore']['rpcs'], 'Datastore RPC')}, {billed.describe()} billed")
    entry: dict[str, Any] = {
        "severity": "INFO", "message": message, "timestamp": {"seconds": int(served), "nanos": int(served % 1 * 1e9)},
        "httpRequest": {"requestMethod": capture["method"], "requestUrl": capture["path"], "status": capture["status"],
                        "latency": f"{capture['app_ms'] / 1000:.4f}s"},
        "appstats": {k: capture[k] for k in ("datastore", "billed", "cache", "app_ms")}}
    trace = TRACE_CONTEXT.fullmatch(request.headers.get("X-Cloud-Trace-Context", ""))
    if trace is not None:
        entry["logging.googleapis.com/trace"] = f"projects/{project}/traces/{trace['trace']}"
        # the header says the span in decimal; a LogEntry's spanId is 16 hex digits
        # (https://cloud.google.com/logging/docs/reference/v2/rest/v2/LogEntry)
        span = int(trace["span"] or 0)
        if 0 < span < 2 ** 64:
            entry["logging.googleapis.com/spanId"] = f"{span:016x}"
        entry["logging.googleapis.com/trace_sampled"] = trace["options"] == "1"
    return entry
