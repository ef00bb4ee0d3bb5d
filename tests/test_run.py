"""`make run`'s stop: Ctrl-C, as a terminal sends it (SIGINT to its whole foreground process group), stops every process
`make run` started and frees its port before it says it stopped, start after start.

`make run`'s own code (`python -m devstack run`) in a folder of its own (DEVSTACK_STATE), with PERSIST=no, on the
backend and cache this suite runs on. Its processes are found by that folder in their environment, which every one
of them inherits."""
import os
import signal
import subprocess
import sys

import requests

from devstack.services import REPO, _port_open, free_port
from devstack.serving import wait_until

STARTS = 2  # each start seeds the demo content afresh: about half a minute


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


def _serving(url):
    try:
        return requests.get(f"{url}/healthz", timeout=5).ok
    except requests.RequestException:
        return False


def test_ctrl_c_stops_every_process_make_run_started_and_frees_its_port(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    marker = f"DEVSTACK_STATE={tmp_path}".encode()
    env = dict(os.environ, DEVSTACK_STATE=str(tmp_path), PERSIST="no", PORT=str(port))
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
