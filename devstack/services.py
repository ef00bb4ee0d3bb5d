"""The local services the app runs on: a Datastore emulator (legacy, or Firestore in Datastore mode) and a cache
(memcached, or redis-server standing in for Memorystore for Valkey).

Both are real servers, started here as child processes on free loopback ports, so a second copy of the stack
(`make test` while `make run` is serving) never clashes with the first. Used by `make run` (devstack.__main__),
by tests/conftest.py and by the benchmarks.
"""
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from core import production_latency
from core.settings import Settings

REPO = Path(__file__).resolve().parent.parent
INDEX_FILE = REPO / "index.yaml"
LOOPBACK = "127.0.0.1"
SDK_FALLBACKS = ("/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk", "/opt/google-cloud-sdk")


class DevstackError(RuntimeError):
    """A service could not be provided; the message says what to install or look at."""


class PortTaken(DevstackError):
    """The port was free when chosen and taken by the time the service bound it."""


def _on_a_free_port(service, start_once, tries=3):
    """Start `service` on its fixed port, or on a free one; if another socket takes that port between choosing it and
    binding it (free_port can only say what is free now), choose again."""
    chosen = service.port is None
    for _ in range(tries if chosen else 1):
        service.port = service.port or free_port()
        try:
            return start_once()
        except PortTaken:
            if not chosen:
                raise
            service.port = None
    raise DevstackError(f"{type(service).__name__}: no free loopback port could be bound in {tries} tries")


def _exited_at_start(what, port, output, whole=None):
    """The error for a service that exited as it started; PortTaken when what it printed (`whole`, if only `output`'s
    tail is shown: a Java emulator's BindException comes a stack trace before its log's end) says its port was taken."""
    error = PortTaken if "Address already in use" in (output if whole is None else whole) else DevstackError
    return error(f"{what} exited at start on port {port}:\n{output}")


def free_port():
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _port_open(port):
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _memcached_answers(port):
    """True when a memcached (not merely some socket) answers on the port."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as conn:
            conn.sendall(b"version\r\n")
            return conn.recv(64).startswith(b"VERSION")
    except OSError:
        return False


def _log_tail(path, lines: int | None = 20):
    """The last `lines` lines of the log at `path` (None: all of it); "" if it cannot be read."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines if lines else 0:])
    except OSError:
        return ""


def _die_with_parent():
    """In the child, before exec: ask Linux to SIGTERM it when the process that started it dies, so a test run or
    `make run` that is killed outright leaves no emulator or memcached behind."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: stop() still stops it


def _wait_listening(proc, port, timeout, what):
    """Until `proc` takes connections on loopback `port`; DevstackError naming `what` if it exits first or the time
    runs out (the caller stops it)."""
    deadline = time.monotonic() + timeout
    while not _port_open(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise DevstackError(f"{what} did not start on port {port}")
        time.sleep(0.05)


def _terminate(proc, timeout):
    """SIGTERM a child started in this session, SIGKILL if it is still there after `timeout` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _stop_group(proc, timeout=10):
    """Stop a child started in its own session, and everything it started (the emulator's java)."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_until_stopped(pids, timeout=5):
    """Return once every thread of `pids` is stopped. kill() only queues SIGSTOP: a process busy on the other core
    may still answer one more request before it stops, which would make a "frozen" service answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for pid in pids:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile is not running either
                for task in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError):
                        # the state follows the command name in parentheses, which may itself hold spaces
                        states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
        if all(state in ("T", "t", "Z", "X") for state in states):
            return
        time.sleep(0.01)
    raise DevstackError(f"processes {sorted(pids)} did not stop within {timeout} s of SIGSTOP")


def _group(pgid):
    """The processes of a process group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rpartition(")")[2].split()[2]) == pgid:
                    members.append(int(entry.name))
    return members


def sdk_roots():
    """Where the Google Cloud CLI may be installed, most likely first."""
    roots = [os.environ.get("CLOUDSDK_ROOT", "")]
    if shutil.which("gcloud"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # then the fallbacks below
            roots.append(subprocess.run(
                ["gcloud", "info", "--format=value(installation.sdk_root)"],
                capture_output=True, text=True, timeout=60).stdout.strip())
    return [Path(root) for root in filter(None, roots + list(SDK_FALLBACKS))]


def sdk_component(folder, file, component):
    """Path of `file` in the Google Cloud CLI's platform/`folder`, or a DevstackError saying what to install."""
    if shutil.which("java") is None:
        raise DevstackError("Java 11 or newer is needed for the emulators: install a JDK "
                            "(apt-get install default-jre-headless).")
    for root in sdk_roots():
        path = root / "platform" / folder / file
        if path.exists():
            return path
    raise DevstackError(f"The {component} was not found: install the Google Cloud CLI and its component "
                        f"(gcloud components install {component}, or apt-get install google-cloud-cli-{component}).")


def emulator_command():
    """The command that runs the legacy emulator: java on the CLI's jar, started directly rather than through the
    CLI's shell launcher, so that the process we stop (and that dies with us) is the emulator itself."""
    launcher = sdk_component("cloud-datastore-emulator", "cloud_datastore_emulator", "cloud-datastore-emulator")
    jar = launcher.parent / "CloudDatastore.jar"
    if not jar.exists():
        return [str(launcher)]
    return [shutil.which("java"), "-cp", str(jar), "com.google.cloud.datastore.emulator.CloudDatastore"]


def firestore_command():
    jar = sdk_component("cloud-firestore-emulator", "cloud-firestore-emulator.jar", "cloud-firestore-emulator")
    return [shutil.which("java"), "-Duser.language=en", "-cp", str(jar),
            "com.google.cloud.datastore.emulator.firestore.CloudFirestore"]


def debian_binary(command, package):
    """Path of `command` (a name on PATH, or an absolute path); installs Debian's `package` when it is missing and this
    runs as root, as `make run` and `make test` must set up a fresh machine themselves. Otherwise a DevstackError
    that says what to install."""
    def find():
        if os.path.isabs(command):
            return command if os.access(command, os.X_OK) else None
        return shutil.which(command)
    found = find()
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        # Two set-ups at once on a fresh machine (two `make test` side by side) would race for apt's own locks, and
        # the one that lost would fail: they take turns on a lock of their own, and the second finds it installed.
        with open(Path(tempfile.gettempdir()) / "devstack-apt.lock", "w") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)
            found = find()
            if found:
                return found
            print(f"devstack: installing Debian's {package} (apt-get)...", flush=True)
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            for step in (["update", "-qq"], ["install", "-y", "-qq", package]):
                subprocess.run(["apt-get", *step], check=False, env=env, stdout=subprocess.DEVNULL)
            found = find()
        if found:
            return found
    raise DevstackError(f"{command} is not installed: install the Debian package '{package}' "
                        f"(sudo apt-get install {package}).")


def memcached_binary():
    return debian_binary("memcached", "memcached")


def redis_binary():
    return debian_binary("redis-server", "redis-server")


class _OnLoopback:
    """A server this process starts on a loopback port: its own (`port`) or, when None, a free one chosen as it
    starts (`_start_once`, within `start_timeout` seconds)."""
    start_timeout = 30

    @property
    def host(self):
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout=None):
        return _on_a_free_port(self, lambda: self._start_once(timeout or self.start_timeout))


class _JavaEmulator(_OnLoopback):
    """An emulator process on a loopback port: started, waited for, stopped with everything it started."""
    backend = None
    name = None
    start_timeout = 90

    def __init__(self, project="scalable-demo", port=None, log_dir=None):
        self.project = project
        self.port = port
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="devstack-"))
        self.proc = None

    @property
    def url(self):
        return f"http://{self.host}"

    def _args(self):
        raise NotImplementedError

    def _start_once(self, timeout):
        args = self._args()
        self.log_path = self.log_dir / f"{self.backend}-emulator-{self.port}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise _exited_at_start(self.name, self.port,
                                       f"its log {self.log_path} ends:\n{_log_tail(self.log_path)}",
                                       whole=_log_tail(self.log_path, lines=None))
            if self.healthy():
                return self
            time.sleep(0.2)
        self.stop()
        raise DevstackError(f"The {self.name} did not answer on {self.url} within {timeout}s; "
                            f"see {self.log_path}:\n{_log_tail(self.log_path)}")

    def healthy(self):
        try:
            with urllib.request.urlopen(self.url + "/", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def pause(self):
        """Freeze the emulator and whatever it started (SIGSTOP to its process group): calls hang, as on a Datastore
        that stops answering."""
        os.killpg(self.proc.pid, signal.SIGSTOP)
        _wait_until_stopped(_group(self.proc.pid))

    def resume(self):
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
        _stop_group(self.proc)
        self.proc = None


class DatastoreEmulator(_JavaEmulator):
    """The legacy Cloud Datastore emulator.

    Started with --require_indexes and the repo's index.yaml, so a query without its composite index fails here as it
    would in production, and with SCATTERED ids as production assigns them. `consistency` below 1.0 makes
    non-ancestor queries lag as Datastore's did before Firestore: only this emulator can show eventual consistency.
    """
    backend, name = "legacy", "Datastore emulator"

    def __init__(self, project="scalable-demo", consistency=1.0, data_dir=None, port=None, log_dir=None):
        super().__init__(project, port, log_dir)
        self.consistency = consistency
        self.data_dir = Path(data_dir) if data_dir else None  # None: in memory only

    def _args(self):
        command = emulator_command()
        project_dir = self.data_dir or self.log_dir / "emulator-project"
        if not (project_dir / "WEB-INF").exists():
            project_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(command + ["create", str(project_dir)], check=True, capture_output=True, timeout=120)
        return command + ["start", f"--host={LOOPBACK}", f"--port={self.port}",
                          f"--consistency={self.consistency}", "--require_indexes", f"--index_file={INDEX_FILE}",
                          "--auto_id_policy=SCATTERED", "--store_index_configuration_on_disk=false",
                          "--store_on_disk=true" if self.data_dir else "--store_on_disk=false", str(project_dir)]

    def fresh(self):
        """An empty datastore for what comes next (a test): every entity dropped. The app's settings need nothing
        more: {}."""
        self.reset()
        return {}

    def reset(self):
        """Drop every entity (in-memory emulators only): tests start each case from nothing."""
        req = urllib.request.Request(self.url + "/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                # /shutdown lets the emulator flush its on-disk store before it exits.
                req = urllib.request.Request(self.url + "/shutdown", data=b"", method="POST")
                urllib.request.urlopen(req, timeout=5).read()
                self.proc.wait(timeout=15)
            except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
                pass
        super().stop()


class FirestoreEmulator(_JavaEmulator):
    """The Firestore emulator in Datastore mode: the database App Engine apps use today, spoken to through the same
    Datastore API (ndb works unchanged through DATASTORE_EMULATOR_HOST).

    What it does not have (Cloud SDK 528): --require_indexes (only the legacy emulator proves index.yaml), __scatter__
    (such a query returns nothing), /reset and __kind__ queries (tests isolate themselves by namespace instead), a
    consistency setting (every query is strongly consistent, as in production), and persistence across restarts in
    Datastore mode. What it shows as production does: pessimistic locks, so contended transactions wait and then fail
    with "Transaction lock timeout" instead of aborting at once.
    """
    backend, name = "firestore", "Firestore emulator"

    def fresh(self):
        """An empty datastore for what comes next (a test): this emulator has no reset in Datastore mode, so a
        namespace of its own. The settings that select it."""
        return {"DATASTORE_NAMESPACE": f"t{uuid.uuid4().hex[:16]}"}

    def _args(self):
        return firestore_command() + ["start", f"--host={LOOPBACK}", f"--port={self.port}",
                                      "--database-mode=datastore-mode", f"--project_id={self.project}"]


class StandIn(_OnLoopback):
    """The stand-in for production's Datastore (devstack/standin.py) as a child process: a gRPC proxy in front of
    `emulator` that waits as the profile says. `knobs`: other values for some of production_latency.KNOBS (tests
    make the bound on one entity small); `seed`: LATENCY_SEED's by default, so that a run's draws can be repeated.
    Only gRPC goes through it: devstack reaches the emulator's HTTP endpoints (/reset) at the emulator's address."""
    name = "stand-in"

    def __init__(self, emulator, profile, knobs=None, seed=None, port=None):
        if profile not in production_latency.PROFILES:
            raise DevstackError(f"The stand-in waits under {', '.join(production_latency.PROFILES)}, not {profile!r}.")
        self.emulator, self.profile, self.knobs = emulator, profile, dict(knobs or {})
        self.seed = production_latency.seed_from(os.environ) if seed is None else seed
        self.port = port
        self.proc = None

    def _start_once(self, timeout):
        args = [sys.executable, "-m", "devstack.standin", "--target", self.emulator.host, "--port", str(self.port),
                "--profile", self.profile, "--backend", self.emulator.backend,
                *(["--seed", str(self.seed)] if self.seed is not None else []),
                *(arg for name, value in self.knobs.items() for arg in ("--set", f"{name}={value}"))]
        self.log_path = self.emulator.log_dir / f"standin-{self.profile}-{self.port}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        try:
            _wait_listening(self.proc, self.port, timeout, self.name)
        except DevstackError:
            exited = self.proc.poll() is not None
            self.stop()
            if exited:
                raise _exited_at_start(self.name, self.port, _log_tail(self.log_path)) from None
            raise
        return self

    def stop(self):
        _stop_group(self.proc)
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class _CacheServer(_OnLoopback):
    """One cache server process on a loopback port. Fault tests stop, pause and restart it on the same port."""
    name = None
    start_timeout = 20

    def __init__(self, port=None, memory_mb=64):
        self.port = port
        self.memory_mb = memory_mb
        self.proc = None

    def _args(self):
        raise NotImplementedError

    def _answers(self):
        raise NotImplementedError

    def _start_once(self, timeout):
        # Its output to a file, not a pipe: nobody reads it once started, and it cannot fill up.
        with tempfile.TemporaryFile() as output:
            self.proc = subprocess.Popen(self._args(), stdin=subprocess.DEVNULL, stdout=output,
                                         stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    output.seek(0)
                    self.proc = None
                    raise _exited_at_start(self.name, self.port, output.read().decode(errors="replace").strip())
                if self._answers():
                    return self
                time.sleep(0.05)
        self.stop()
        raise DevstackError(f"{self.name} did not listen on {self.host} within {timeout}s")

    def healthy(self):
        return self.proc is not None and self.proc.poll() is None and self._answers()

    def pause(self):
        """Freeze the server (SIGSTOP): connections hang instead of failing, the hard case for timeouts."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        _wait_until_stopped([self.proc.pid])

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
        _stop_group(self.proc)
        self.proc = None

    def restart(self):
        """Stop and start again on the same port, empty, as after a crash."""
        self.stop()
        return self.start()

    def env(self):
        """What the app reads to find this server (core/settings.py)."""
        raise NotImplementedError


class Memcached(_CacheServer):
    """memcached, the talk's cache (Memorystore for Memcached on App Engine)."""
    name = backend = "memcached"  # backend: what core.cache calls it

    def _args(self):
        args = [memcached_binary(), "-l", LOOPBACK, "-p", str(self.port), "-U", "0", "-m", str(self.memory_mb),
                "-t", "2"]
        if os.geteuid() == 0:
            args += ["-u", "root"]  # memcached refuses to run as root without being told so
        return args

    def _answers(self):
        return _memcached_answers(self.port)

    def env(self):
        return {"MEMCACHED_HOSTS": self.host, "REDIS_URL": ""}


class Redis(_CacheServer):
    """Debian's redis-server standing in for Memorystore for Valkey (the same protocol): in memory only, evicting
    the least recently used keys when full, as a cache should."""
    name, backend = "redis-server", "redis"

    def _args(self):
        return [redis_binary(), "--bind", LOOPBACK, "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--maxmemory", f"{self.memory_mb}mb", "--maxmemory-policy", "allkeys-lru", "--daemonize", "no",
                "--protected-mode", "yes", "--loglevel", "warning"]

    def _answers(self):
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self):
        return f"redis://{self.host}/0"

    def env(self):
        return {"MEMCACHED_HOSTS": "", "REDIS_URL": self.url}


CACHES = {"memcached": Memcached, "redis": Redis}


def cache_from_env(env=None):
    """The cache `make run/test/bench CACHE=...` asks for: memcached (the default, the talk's) or redis."""
    cache = (os.environ if env is None else env).get("CACHE") or "memcached"
    if cache not in CACHES:
        raise DevstackError(f"CACHE must be one of {', '.join(CACHES)}, not {cache!r}.")
    return cache


BACKENDS = ("legacy", "firestore")


def backend_from_env(env=None):
    """The backend `make run/test/bench DATASTORE=...` asks for: legacy (the default, the one that enforces
    index.yaml) or firestore."""
    backend = (os.environ if env is None else env).get("DATASTORE") or "legacy"
    if backend not in BACKENDS:
        raise DevstackError(f"DATASTORE must be one of {', '.join(BACKENDS)}, not {backend!r}.")
    return backend


class Stack:
    """An emulator (legacy Datastore or Firestore in Datastore mode) plus a cache (memcached or Redis), and the
    environment the app reads to find them."""

    def __init__(self, consistency=1.0, data_dir=None, project="scalable-demo", backend="legacy", cache=None):
        if backend == "firestore":
            self.emulator = FirestoreEmulator(project=project)  # always strongly consistent; keeps nothing on disk
        else:
            self.emulator = DatastoreEmulator(project=project, consistency=consistency, data_dir=data_dir)
        self.backend = backend
        self.cache = CACHES[cache or cache_from_env()]()
        self.standins = {}  # by profile: each started when an app is first given its address
        self._standins_lock = threading.Lock()  # tests build apps on several threads

    def start(self):
        try:
            self.cache.start()
            self.emulator.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for standin in self.standins.values():
            standin.stop()
        self.standins.clear()
        self.emulator.stop()
        self.cache.stop()

    def standin(self, profile):
        """The stand-in for production's Datastore under `profile`, in front of this stack's emulator: started the
        first time it is asked for, then shared by every client of the stack under that profile."""
        with self._standins_lock:
            if profile not in self.standins:
                self.standins[profile] = StandIn(self.emulator, profile).start()
            return self.standins[profile]

    def settings(self, **env):
        """The settings of an app on this stack: its environment (under env's LATENCY, when it names one), `env`
        added (e.g. SECRET_KEY)."""
        return Settings.from_env(dict(self.env(env.get("LATENCY")), **env))

    def fresh(self):
        """An empty datastore for the next test, however this stack's emulator gives one (`emulator.fresh()`), and
        the cache running (a fault test that failed half way may have left it stopped): the settings that select
        them."""
        overrides = self.emulator.fresh()
        if not self.cache.healthy():
            self.cache.restart()
        return overrides

    def env(self, latency=None):
        """What a client of this stack reads to find it, under `latency` (LATENCY's by default, as `make run`, `make
        test`, `make bench` and `make load` give it): under a profile, the Datastore's address is the stand-in's, so
        that every client waits production's waits there, in one place."""
        latency = latency or os.environ.get("LATENCY") or "none"
        on = latency in production_latency.PROFILES  # any other name: the app's settings refuse it
        return {
            "DATASTORE_EMULATOR_HOST": self.standin(latency).host if on else self.emulator.host,
            "DATASTORE_DATASET": self.emulator.project,
            "GOOGLE_CLOUD_PROJECT": self.emulator.project,
            "DATASTORE_BACKEND": self.backend,
            "DEV_SIGNIN": "on",  # local development: the dev sign-in (core/settings.py)
            **self.cache.env(),
            **({"LATENCY": latency} if latency != "none" else {}),
        }

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
