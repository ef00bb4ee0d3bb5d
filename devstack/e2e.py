"""What the browser tests and `make screenshots` need beside the stack: the app served over HTTP on loopback, and
Debian's Chromium driven by Playwright (never a browser Playwright downloads: the machine has no internet for it)."""
import os
import threading
from contextlib import contextmanager

from werkzeug.serving import WSGIRequestHandler, make_server

from core import runtime
from devstack.services import LOOPBACK, DevstackError, free_port

CHROMIUM = "/usr/bin/chromium"
# Headless as root; and nothing that phones home: on a closed network Chromium's background connections fail, many at
# a time, and slow every start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def launch(playwright):
    """Headless Debian Chromium under Playwright's control."""
    if not os.access(CHROMIUM, os.X_OK):
        raise DevstackError(f"Chromium is not installed at {CHROMIUM}: `apt-get install chromium` (as root), then again.")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args):  # a line per request would bury a failing test's output
        pass


@contextmanager
def served(make_app):
    """make_app(url) -> the app (with TASKS_BACKEND=http), served on a free loopback port on threads; yields
    (app, url). The app learns its own URL before it is built, so that its local task queue delivers to it."""
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    app = make_app(url)
    server = make_server(LOOPBACK, port, app, threaded=True, request_handler=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="served-app", daemon=True)
    thread.start()
    try:
        yield app, url
    finally:
        server.shutdown()
        thread.join()
        runtime.current().tasks.wait()  # deliveries still on their way, before the stack goes
        runtime.current().close()
