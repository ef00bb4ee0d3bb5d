"""`make run`'s stop: Ctrl-C, as a terminal sends it (SIGINT to its whole foreground process group), stops every process
`make run` started and frees its port before it says it stopped, start after start.

`make run`'s own code (`python -m devstack run`) in a folder of its own (DEVSTACK_STATE), with PERSIST=no, on the
backend and cache this suite runs on. Its processes are found by that folder in their environment, which every one
of them inherits."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref

import pytest
import requests

import devstack.__main__ as devstack_run
from devstack.services import REPO, _port_open, free_port
from devstack.serving import wait_until

STARTS = 2  # each start seeds the demo content afresh: about half a minute
# These tests find what a start started by its environment (/proc/PID/environ). gunicorn renames its processes with
# setproctitle when it is installed (mutmut brings it, requirements-dev.txt), which overwrites that area unless
# SPT_NOENV is set (setproctitle's README, "Environment variables": https://pypi.org/project/setproctitle/).
KEEP_ENVIRON = {"SPT_NOENV": "1"}


def _started_by(marker):
    """The processes whose environment holds `marker` (b"NAME=value")."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:  # gone meanwhile, or a zombie
            continue
    return found


def _command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _serving(url, timeout=5):
    try:
        return requests.get(f"{url}/healthz", timeout=timeout).ok
    except requests.RequestException:
        return False


def test_ctrl_c_stops_every_process_make_run_started_and_frees_its_port(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    marker = f"DEVSTACK_STATE={tmp_path}".encode()
    env = dict(os.environ, DEVSTACK_STATE=str(tmp_path), PERSIST="no", PORT=str(port), **KEEP_ENVIRON)
    for start in range(STARTS):
        # A session of its own stands in for the terminal: its process group is the terminal's foreground group.
        run = subprocess.Popen([sys.executable, "-m", "devstack", "run"], cwd=REPO, env=env, start_new_session=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda run=run: _serving(url) or run.poll() is not None, "make run to serve", timeout=240)
            assert run.poll() is None, run.stdout.read()
            ours = _started_by(marker)
            gunicorn = [pid for pid in ours if "gunicorn" in _command(pid)]
            assert len(gunicorn) == 3, [_command(pid) for pid in ours]  # the master and its two workers
            # Out of the terminal's group: Ctrl-C reaches gunicorn only through its master, once.
            assert all(os.getpgid(pid) != run.pid for pid in gunicorn)
            os.killpg(run.pid, signal.SIGINT)  # Ctrl-C
            output, _ = run.communicate(timeout=90)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        assert run.returncode == 0, output
        assert "Stopped the app" in output
        # Once it says so, nothing it started is left, and the port is free.
        assert [_command(pid) for pid in _started_by(marker)] == [], f"start {start + 1}"
        assert not _port_open(port), f"start {start + 1}"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt, on purpose
def test_a_ctrl_c_whose_exception_python_dropped_still_stops_the_wait_while_serving(monkeypatch):
    """Ctrl-C raises KeyboardInterrupt wherever the main thread is; Python drops one raised while a finalizer runs.
    urllib3 closes a pool's connections in one, and CI once saw Ctrl-C land there, just as `make run` began to serve:
    the interrupt was printed, dropped, and the run waited on gunicorn for ever. The wait hears it all the same."""
    monkeypatch.setattr(devstack_run, "_stopping", False)  # put back after the test: it sets it
    gunicorn = subprocess.Popen(["sleep", "5"])  # stands in for the server: a process that would outlive the test
    pool = type("Pool", (), {})()
    weakref.finalize(pool, devstack_run._interrupt)
    try:
        del pool  # the finalizer runs here: its KeyboardInterrupt is printed and dropped, as urllib3's was
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            devstack_run._until_stopped(gunicorn)
        assert time.monotonic() - began < 2 and gunicorn.poll() is None
    finally:
        gunicorn.kill()
        gunicorn.wait()


class _Run:
    """`python -m devstack run` in a state folder of its own, its output read line by line as it comes."""

    def __init__(self, state, **env):
        self.marker = f"DEVSTACK_STATE={state}".encode()
        self.lines, self.answered = [], None
        started_env = dict(os.environ, DEVSTACK_STATE=str(state), PERSIST="no", **KEEP_ENVIRON, **env)
        self.proc = subprocess.Popen([sys.executable, "-m", "devstack", "run"], cwd=REPO, start_new_session=True,
                                     env=started_env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            found = re.search(r"Serving on (http://\S+)/", line)
            if found:
                # The app answered there before the URL was announced: the app's own line for the start's probe of
                # /healthz (written to the same pipe before its answer is sent) comes first, whatever this machine's
                # speed. (That the URL then answers the test is checked after.)
                self.url = found[1]
                self.answered = any(earlier.startswith("GET /healthz 200 ") for earlier in self.lines[:-1])

    def output(self):
        return "".join(self.lines)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            self.proc.wait(timeout=90)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.reader.join(timeout=10)


def _listening_inodes(port):
    """The inodes of the loopback sockets listening on `port` (/proc/net/tcp: state 0A is LISTEN)."""
    inodes = set()
    with open("/proc/net/tcp") as f:
        for row in list(f)[1:]:
            fields = row.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
                inodes.add(fields[9])
    return inodes


def _holds_socket(pid, inodes):
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes}
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_two_starts_at_the_same_moment_each_serve_their_own_announced_url(tmp_path):
    """Both want 8080: one has it, the other a free port, chosen by binding it, so that nothing can take it between
    the choice and gunicorn. Each announces its URL only once its app answers there, and what listens there is a
    process that start started."""
    runs = [_Run(tmp_path / f"run{i}") for i in range(2)]
    try:
        wait_until(lambda: all(r.answered is not None or r.proc.poll() is not None for r in runs),
                   "both starts to announce their URL", timeout=300)
        for run in runs:
            assert run.proc.poll() is None, run.output()
            assert run.answered, f"announced {run.url} before it answered:\n{run.output()}"
        assert runs[0].url != runs[1].url
        for run, other in (runs, runs[::-1]):
            port = int(run.url.rsplit(":", 1)[1])
            owners = [pid for pid in _started_by(run.marker) if _holds_socket(pid, _listening_inodes(port))]
            assert owners and all("gunicorn" in _command(pid) for pid in owners), run.output()
            assert not any(_holds_socket(pid, _listening_inodes(port)) for pid in _started_by(other.marker))
            assert _serving(run.url)
    finally:
        for run in runs:
            run.stop()
    for run in runs:
        assert run.proc.returncode == 0, run.output()


def test_a_port_asked_for_and_taken_fails_at_once_saying_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = _Run(tmp_path, PORT=str(port))
        try:
            run.proc.wait(timeout=60)
        finally:
            run.stop()
    assert run.proc.returncode == 1
    assert f"port {port} is taken" in run.output()
    assert "Serving on" not in run.output()
    assert _started_by(run.marker) == []


def test_a_start_whose_app_server_fails_exits_non_zero_saying_why_and_stops_everything(tmp_path):
    """gunicorn refuses to start (here a bad setting in its environment, GUNICORN_CMD_ARGS): nothing is announced,
    gunicorn's own error and make run's reason are printed, everything it started stops, the status is not 0."""
    run = _Run(tmp_path, GUNICORN_CMD_ARGS="--workers=nope")
    try:
        run.proc.wait(timeout=300)
    finally:
        run.stop()
    output = run.output()
    assert run.proc.returncode == 1, output
    assert "Serving on" not in output
    assert "invalid int value: 'nope'" in output  # gunicorn's own reason
    assert "make run failed: gunicorn exited (status 2) before the app answered" in output
    assert "Stopped the app" in output
    assert _started_by(run.marker) == []
