"""The app served on loopback: in-process on threads (the browser tests, `make screenshots`), or by gunicorn as App
Engine's entrypoint (`make run`, bench/pages.py)."""
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager, suppress

import requests
from werkzeug.serving import WSGIRequestHandler, make_server

from core import runtime
from core.tasks import local_token
from devstack.cloudtasks import LocalTasks
from devstack.services import LOOPBACK, REPO, DevstackError, _die_with_parent, _terminate, _wait_listening, free_port


def app_env(stack, secret, admins=None, tasks=None, latency=None):
    """The app's environment under `make run`: the stack's addresses under `latency` (LATENCY's by default: then the
    Datastore's is the stand-in's), and the local Cloud Tasks `tasks` (a LocalTasks) if the app is to enqueue."""
    return dict(**stack.env(latency), **(tasks.env() if tasks else {}), SECRET_KEY=secret, FLASK_APP="main:create_app",
                ADMIN_EMAILS=os.environ.get("ADMIN_EMAILS", "") if admins is None else admins)


def local_tasks(url, secret, store=None):
    """devstack's local Cloud Tasks delivering to the app at `url` whose secret key is `secret` (not started)."""
    return LocalTasks(url, local_token(secret), store=store)


def listening(port=None, or_any=True):
    """A loopback socket listening on `port` (None: any free one), held by this process until gunicorn inherits it.
    Checking a port and binding it later is a race (another `make run` takes it meanwhile, and this one announces a
    URL that serves the other app): a socket bound and listening from the start is the check, and no one else can
    take its port after. `or_any`: when `port` is taken, a free port instead of the error. OSError if taken."""
    sock = socket.socket()
    # SO_REUSEADDR as gunicorn's own: a port whose last connections linger in TIME_WAIT (the previous `make run`,
    # stopped a moment ago) binds again. Linux still refuses it while another socket listens there, and two sockets
    # that both bound it before either listened meet at listen(): the later one's fails.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port or 0))
        sock.listen(2048)  # gunicorn's default backlog
    except OSError:
        sock.close()
        if not (port and or_any):
            raise
        return listening(None)
    return sock


class Gunicorn:
    """gunicorn serving main:app as App Engine's entrypoint does (app.yaml: two workers of eight threads), on a
    loopback port. Each worker is a process of its own: nothing in one worker's memory reaches another.

    `listener`: a listening socket (listening()) that gunicorn takes over (its `fd://` bind) instead of binding a port
    itself; the port is then this server's from before it starts, and `wait_ready` waits for the app to answer."""

    def __init__(self, env, port=None, access_log=False, wait=True, app="main:app", output=None, workers=2,
                 threads=8, listener=None):
        self.listener = listener
        self.port = listener.getsockname()[1] if listener else port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        bind = f"fd://{listener.fileno()}" if listener else f"{LOOPBACK}:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--bind", bind, "--workers", str(workers),
             "--threads", str(threads),
             *(["--access-logfile", "-"] if access_log else ["--log-level", "warning"]), app],
            env=dict(os.environ, **env), cwd=REPO, preexec_fn=_die_with_parent, stdout=output, stderr=output,
            pass_fds=(listener.fileno(),) if listener else (),
            # A session of its own, so that a terminal's Ctrl-C reaches only whoever started it, who stops the master,
            # which stops its workers once. In the terminal's process group every worker got SIGINT twice (from the
            # terminal and from its master), and gunicorn's gthread worker can hang in its second shutdown, orphaned
            # and still holding the port.
            start_new_session=True)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=60):
        """Until the server takes connections (a request sent before a worker has loaded the app waits for it); on an
        inherited listener, which takes connections before gunicorn even starts, until the app answers /healthz."""
        try:
            if self.listener:
                self._wait_answering(timeout)
            else:
                _wait_listening(self.proc, self.port, timeout, "gunicorn")
        except DevstackError:
            self.stop()
            raise
        return self

    def _wait_answering(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise DevstackError(f"gunicorn exited (status {self.proc.returncode}) before the app answered on "
                                    f"{self.url}; its error is above")
            with suppress(requests.RequestException), requests.Session() as direct:
                direct.trust_env = False  # loopback: never through a proxy the environment names
                if direct.get(f"{self.url}/healthz", timeout=5).ok:
                    return
            if time.monotonic() > deadline:
                raise DevstackError(f"the app did not answer on {self.url} within {timeout} s")
            time.sleep(0.2)

    def stop(self):
        """SIGTERM to the master, which finishes the requests in flight (its graceful timeout is 30 s) and stops its
        workers; then SIGKILL to whatever of its session is left (a worker that outlived its master)."""
        _terminate(self.proc, timeout=20)
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@contextmanager
def instances(env, count, workers=1, threads=8, app="main:app"):
    """`count` gunicorn servers of `app` side by side on one stack, standing in for App Engine instances (each
    `workers` processes of `threads` threads): a list of them, started together, warmed up, and stopped at the end."""
    with ExitStack() as stack:
        servers = []
        for _ in range(count):
            server = Gunicorn(env, wait=False, app=app, workers=workers, threads=threads, output=subprocess.DEVNULL)
            stack.callback(server.stop)
            servers.append(server)
        for server in servers:
            server.wait_ready()
            _warm(server.url, workers * threads)
        yield servers


@contextmanager
def queued(stack, secret, admins="", workers=2, threads=8, app="main:app", queue_yaml=None, **env):
    """The deployed shape on loopback: gunicorn (`workers` processes of `threads` threads) serving `app` on `stack`,
    its tasks in devstack's local Cloud Tasks (queue.yaml's rate, concurrency and retries), outside its processes.
    `env` adds to the app's environment (and the task server's: a setting may be a cron job's schedule);
    `queue_yaml` another queue.yaml than the app's. Yields the Gunicorn, warmed up; the tasks stop before it, so that
    nothing is delivered to a server that is going away."""
    port = free_port()
    with ExitStack() as stop:
        tasks = LocalTasks(f"http://{LOOPBACK}:{port}", local_token(secret), env=env,
                           **({"queue_yaml": queue_yaml} if queue_yaml else {}))
        server = Gunicorn(dict(app_env(stack, secret, admins=admins, tasks=tasks, latency=env.get("LATENCY")), **env),
                          port, app=app, workers=workers, threads=threads, output=subprocess.DEVNULL)
        stop.callback(server.stop)
        stop.enter_context(tasks)
        _warm(server.url, workers * threads)
        yield server


def _warm(url, requests_at_once):
    """Requests to every worker of a server at once, so that each has loaded the app before anything is timed."""
    with concurrent.futures.ThreadPoolExecutor(requests_at_once) as pool:
        list(pool.map(lambda _: requests.get(f"{url}/healthz", timeout=60), range(requests_at_once)))


def signed_in(url, email, admin=False):
    """A requests session signed in at `url` by the dev sign-in (every server that shares the secret accepts its
    cookie). Sessions are not shared between threads: make one per thread."""
    session = requests.Session()
    response = session.post(f"{url}/api/session", json={"email": email, "admin": admin}, timeout=30)
    response.raise_for_status()
    return session


def wait_until(check, what, timeout=30.0, interval=0.2):
    """Poll check() until it returns something true, at most `timeout` seconds; that value. `what` names the wait in
    the error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise DevstackError(f"{what}: not after {timeout} s")


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args):  # a line per request would bury a failing test's output
        pass


@contextmanager
def served(make_app):
    """make_app(tasks_env) -> the app, served on a free loopback port on threads, with a local Cloud Tasks delivering
    to it; yields (app, url). `tasks_env`: the settings that point the app's queue at that server."""
    port, tasks_port = free_port(), free_port()
    url = f"http://{LOOPBACK}:{port}"
    app = make_app(LocalTasks.env_at(tasks_port))
    rt = runtime.of(app)
    tasks = LocalTasks(url, local_token(rt.settings.secret_key), port=tasks_port)
    server = make_server(LOOPBACK, port, app, threaded=True, request_handler=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="served-app", daemon=True)
    thread.start()
    try:
        with tasks:
            yield app, url
    finally:
        server.shutdown()
        thread.join()
        rt.close()
