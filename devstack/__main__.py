"""`python -m devstack run`: what `make run` does.

Starts the cache (memcached, or redis-server with CACHE=redis), the Datastore emulator (data kept on disk in
.devstack/, git-ignored) and a local Cloud Tasks (devstack/cloudtasks.py; its tasks kept in .devstack/tasks.sqlite3
beside the data), seeds demo content when the datastore is empty, serves the web UI with gunicorn (the App Engine
entrypoint), and stops all of it on exit.
"""
import argparse
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from devstack.services import REPO, DevstackError, Stack, backend_from_env
from devstack.serving import Gunicorn, app_env, listening, local_tasks

# DEVSTACK_STATE: another folder for the lock, the secret and the data (tests/test_run.py runs `make run`'s code beside
# a developer's own).
STATE = Path(os.environ.get("DEVSTACK_STATE") or REPO / ".devstack")


def _dev_secret():
    """A random secret kept across restarts, so sign-ins survive a restart of `make run`."""
    path = STATE / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


_stopping = False  # Ctrl-C or kill came, whether or not its KeyboardInterrupt got through


def _interrupt(*_):
    # The KeyboardInterrupt cuts short whatever the main thread is doing (starting a service, seeding). Python drops an
    # exception raised while a finalizer runs (urllib3 closes a pool's connections in one), and the Ctrl-C with it, so
    # the handler also sets a flag: a plain one, for a lock (threading.Event's) may be held by the code it interrupts.
    # (https://docs.python.org/3/library/signal.html#note-on-signal-handlers-and-exceptions)
    global _stopping
    _stopping = True
    raise KeyboardInterrupt


def _until_stopped(proc):
    """The wait while serving: `proc`'s status if it exits; KeyboardInterrupt once stopped, even by a Ctrl-C whose
    exception Python dropped (then at most half a second late)."""
    while not _stopping:
        if proc.poll() is not None:
            return proc.returncode
        time.sleep(0.5)
    raise KeyboardInterrupt


def run(port):
    STATE.mkdir(exist_ok=True)
    lock = open(STATE / "run.lock", "a+")  # noqa: SIM115 - held open while this process runs: the lock lives with it
    try:
        # The on-disk datastore belongs to one emulator at a time.
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        where = lock.read().strip() or "see the other terminal"
        sys.exit(f"make run is already running here ({where}); stop it first.")
    # The port is taken now, before the minute of starting and seeding, by a socket gunicorn inherits: nobody can
    # take it meanwhile. 8080 unless something listens there (another `make run`): then any free port. A port asked
    # for (PORT=, --port) and taken is an error.
    try:
        listener = listening(port or 8080, or_any=port is None)
    except OSError as e:
        sys.exit(f"make run: port {port} is taken ({e.strerror}); stop what listens there or choose another PORT.")
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    lock.seek(0)
    lock.truncate()
    lock.write(url)
    lock.flush()

    # Legacy: consistency 0.9, the emulator's default: non-ancestor queries lag a little, as Datastore's did.
    # PERSIST=no keeps its data in memory only: its on-disk store can deadlock under concurrent writes (seen under
    # `make load`: the flush thread waits for a write lock a commit's read lock blocks, while that commit holds the
    # store's monitor every other call waits for), so load tests run on a `make run PERSIST=no`.
    backend = backend_from_env()
    persist = os.environ.get("PERSIST", "yes") != "no"
    stack = Stack(consistency=0.9, data_dir=STATE / "datastore" if persist else None, backend=backend)
    # The tasks are kept only where the data is: tasks left from a datastore that is gone (Firestore's, PERSIST=no)
    # would run against data they were not made for.
    store = STATE / "tasks.sqlite3"
    if not persist or backend == "firestore":
        for leftover in STATE.glob("tasks.sqlite3*"):
            leftover.unlink()
    secret = _dev_secret()
    tasks = local_tasks(url.rstrip("/"), secret, store=store)
    server = None
    failed = None
    # Ctrl-C and `kill` both stop everything; SIGINT set explicitly, since a shell that starts us in the background
    # makes Python ignore it.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        print(f"Starting {stack.cache.name}, the {stack.emulator.name} and the {tasks.name}...", flush=True)
        if backend == "firestore":
            print("Note: the Firestore emulator keeps no data across restarts in Datastore mode, so the demo content "
                  "is seeded afresh at every start (DATASTORE=legacy keeps yours in .devstack/).", flush=True)
        stack.start()
        tasks.start()
        env = app_env(stack, secret, tasks=tasks)
        # Seeded on the bare emulator, as bench/pages.py seeds: setting up is no lesson, and under a profile the
        # stand-in holds the demo blog's index entity to production's one write a second (the seed took 156 s, not 14).
        bare = {**app_env(stack, secret, tasks=tasks, latency="none"), "LATENCY": "none"}
        seeded = subprocess.run([sys.executable, "-m", "flask", "seed"], env={**os.environ, **bare}, cwd=REPO)
        if seeded.returncode:
            raise DevstackError(f"Seeding the demo content failed (status {seeded.returncode}); its error is above.")
        # The app logs a line per request itself (appstats). Announced once it answers there, not before.
        server = Gunicorn(env, listener=listener, wait=False)
        listener.close()  # gunicorn holds it now
        server.wait_ready(timeout=120)
        print(f"\n  Serving on {url}  (Ctrl-C stops the app, the emulator, the task queue and {stack.cache.name})\n",
              flush=True)
        status = _until_stopped(server.proc)
        raise DevstackError(f"gunicorn stopped on its own (status {status}); its error is above.")
    except KeyboardInterrupt:
        pass
    except DevstackError as e:
        failed = f"make run failed: {e}"
    finally:
        if server is not None:
            server.stop()
        tasks.stop()
        stack.stop()
        print(f"Stopped the app, the {tasks.name}, the {stack.emulator.name} and {stack.cache.name}.", flush=True)
    if failed:
        sys.exit(failed)  # status 1, and make says so


def main():
    parser = argparse.ArgumentParser(prog="python -m devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="services + demo data + web UI (make run)")
    run_parser.add_argument("--port", type=int, default=int(os.environ["PORT"]) if os.environ.get("PORT") else None)
    args = parser.parse_args()
    if args.command == "run":
        run(args.port)


if __name__ == "__main__":
    main()
