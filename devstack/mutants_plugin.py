"""A pytest plugin for `make mutants` (devstack/mutants.py): each mutant's pytest session borrows the emulator the
driver started, instead of starting one of its own.

mutmut runs a fresh pytest session for each mutant (forked from its fork server). tests/conftest.py's session fixture
`stack` would start a Java emulator every time: 3-5 s of start and stop per mutant, more than most mutants' tests take.
Under `MUTANTS_SHARED_EMULATOR` (set by the driver, JSON: backend, port, pid), the Stack that fixture builds takes that
running emulator instead: same code path, same emulator flags, its data reset before each test as always
(`stack.fresh()`). Only the `stack` fixture's own Stack borrows (a hook around that fixture's setup says which one);
any other Stack a test starts (weak_stack at consistency 0.9, firestore_stack) is its own, as in `make test`. The cache
is still the session's own (memcached starts in a few ms), so the fault tests that stop and restart it work unchanged;
the emulator's pause and resume reach the borrowed process by its process group, and its stop is left to the driver.

A session that finds the shared emulator not answering ends with exit code 35, which mutmut reports as "suspicious",
never as a kill. `MUTANTS_TIMINGS` names a file where each session appends one JSON line: the mutant (mutmut's
MUTANT_UNDER_TEST), its wall time and pytest's exit status.

A mutant's tests run fastest first, by their call times in mutmut's stats run (setup not counted: a test that starts
an emulator of its own can come early): mutmut's fork server names them in no order (a set) and stops at the first
failure (-x), so a mutant that one quick test kills is judged without the slow tests that reach its function too (the
mapper's, which wait on their deliveries). A survivor runs them all either way. The sort runs before pytest's own,
which then groups the tests of a parametrized module fixture again (tests/test_sessions.py's `each_cache`). Order
changes no verdict as long as no test leans on another having run before it: each test starts from data of its own
(`stack.fresh()`).

The tests' queue (devstack/taskqueue.py) puts a failed task back in line at once, bounded only by 10,000 deliveries
or 300 s. A mutant that makes a task's every delivery fail (a TypeError where a job ends) spun each test that drained
it for about 190 s before an assertion failed. Here a task that failed STUCK_AFTER deliveries in a row is taken out
of line and the drain fails the test, naming it: such a mutant is killed in seconds. Cloud Tasks itself stops at
core/tasks.MAX_DELIVERIES. mutmut's clean run (the tests that reach the mutants named, unmutated) goes through this
too: a test that trips it there fails the clean run, and mutmut stops before judging any mutant.
"""
import collections
import contextlib
import json
import os
import signal
import time

import pytest

from devstack import services, taskqueue

SHARED = json.loads(os.environ["MUTANTS_SHARED_EMULATOR"]) if os.environ.get("MUTANTS_SHARED_EMULATOR") else None
_borrowing = {"next": False}
_started = {"at": 0.0}


class _Borrowed:
    """Stands for the Popen of an emulator this process did not start: its pid (a process group's leader, as devstack
    starts emulators in their own session), alive or not. Enough for pause() and resume(), which signal the group."""

    def __init__(self, pid):
        self.pid = pid

    def poll(self):
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 0
        return None


_original_start = services.Stack.start


def _start(self):
    if not (SHARED and _borrowing["next"] and self.backend == SHARED["backend"]):
        return _original_start(self)
    _borrowing["next"] = False
    emulator = self.emulator
    emulator.port, emulator.proc = SHARED["port"], _Borrowed(SHARED["pid"])
    emulator.stop = lambda: None  # the driver's to stop, after the last mutant
    with contextlib.suppress(ProcessLookupError):  # a mutant killed while a fault test froze it must not leave it so
        os.killpg(SHARED["pid"], signal.SIGCONT)
    if not emulator.healthy():
        pytest.exit(f"the shared {emulator.name} on port {emulator.port} does not answer", returncode=35)
    try:
        self.cache.start()
    except BaseException:
        self.stop()
        raise
    return self


services.Stack.start = _start


STUCK_AFTER = 200  # deliveries in a row that failed; about 4 s of a drain
_original_drain = taskqueue.DrainedQueue.drain


def _drain(self, deliver, *args, **kwargs):
    failed_in_a_row: collections.Counter = collections.Counter()
    stuck = set()

    def bounded(task):
        if failed_in_a_row[task.name] >= STUCK_AFTER:
            stuck.add(task.name)
            return True  # out of line
        try:
            ok = deliver(task)
        except Exception:
            failed_in_a_row[task.name] += 1
            raise
        failed_in_a_row[task.name] = 0 if ok else failed_in_a_row[task.name] + 1
        return ok
    count = _original_drain(self, bounded, *args, **kwargs)
    if stuck:
        raise AssertionError(f"tasks {sorted(stuck)} failed {STUCK_AFTER} deliveries in a row")
    return count


taskqueue.DrainedQueue.drain = _drain


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.argname != "stack" or SHARED is None:
        return (yield)
    _borrowing["next"] = True
    try:
        return (yield)
    finally:
        _borrowing["next"] = False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":  # the run that records the times: as collected
        return
    try:
        with open("mutmut-stats.json") as stats:  # mutmut runs each mutant's session in its mutants/ directory
            seconds = json.load(stats)["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: seconds.get(item.nodeid, float("inf")))


def pytest_configure(config):
    _started["at"] = time.monotonic()


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MUTANTS_TIMINGS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"mutant": os.environ.get("MUTANT_UNDER_TEST", ""), "exit": int(exitstatus),
                                  "seconds": round(time.monotonic() - _started["at"], 3)}) + "\n")
