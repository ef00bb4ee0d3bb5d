"""The accounting's Flask side: every response gets its request's costs (core/costs.py counts them) in its
`Server-Timing` header and one log line, pages get them for their footer, and the process keeps the last ones for
/appstats. Installed on every app by create_app, whichever features it has."""
import json
import logging
import re
import sys

from flask import current_app, request

from core import clock, runtime
from core.costs import Recent, current

log = logging.getLogger("appstats")
TRACE_HEADER = "X-Cloud-Trace-Context"  # TRACE_ID/SPAN_ID;o=1, set by App Engine's front end
RECENT = 100  # requests kept per process for /appstats
TRACE_CONTEXT = re.compile(r"(?P<trace>[0-9a-f]{32})(?:/(?P<span>\d{1,20}))?(?:;o=(?P<options>[01]))?")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def init_app(app):
    """Bind the accounting to `app`: every response gets its Server-Timing header and one log line, and joins the
    process's recent requests; pages get `request_cost()` for their footer. Off with APPSTATS=off (no counting)."""
    settings = runtime.of(app).settings
    app.extensions["appstats"] = Recent(RECENT)
    if not log.handlers:  # once per process: one line per request, JSON on App Engine (Cloud Logging reads stdout)
        handler = logging.StreamHandler(sys.stdout if settings.on_app_engine else sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # the line as it is, once: not again through the root logger's format (main.app's)
    app.add_template_global(_request_cost, "request_cost")
    app.after_request(_account)


def _cache_name(backend):
    """The cache as the footer and the log line say it: its backend, or just "cache" when there is none."""
    return backend if backend != "none" else "cache"


def _request_cost():
    cost = current()
    return cost.footer(_cache_name(runtime.of(current_app).cache.backend)) if cost is not None else None


def _account(response):
    cost = current()
    if cost is None:
        return response
    rt = runtime.of(current_app)
    settings, backend = rt.settings, rt.cache.backend
    response.headers["Server-Timing"] = cost.server_timing()
    record = {"method": request.method, "path": request.full_path.rstrip("?"), "status": response.status_code,
              "at": clock.iso(clock.now()), **cost.summary(backend)}
    current_app.extensions["appstats"].add(record)
    if settings.on_app_engine:
        log.info(json.dumps(_structured(record, settings.project, request.headers.get(TRACE_HEADER))))
    else:
        log.info(_readable(record, _cache_name(backend)))
    return response


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


def _readable(record, cache_name):
    datastore, cache = record["datastore"], record["cache"]
    by_method = ", ".join(f"{n} {m}" for m, n in sorted(datastore["by_method"].items()))
    by_call = ", ".join(f"{n} {c}" for c, n in sorted(cache["by_call"].items()))
    billed = record["billed"]
    return (f"{_printable(record['method'])} {_printable(record['path'])} {record['status']} "
            f"{record['app_ms']:.1f} ms | "
            f"datastore {datastore['rpcs']} RPCs {datastore['ms']:.1f} ms ({by_method or 'none'}) | "
            f"{cache_name} {cache['calls']} calls {cache['ms']:.1f} ms ({by_call or 'none'}) | "
            f"billed {billed['reads']} reads {billed['writes']} writes {billed['deletes']} deletes "
            f"${billed['usd_per_million']:.2f}/M")
