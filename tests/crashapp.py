"""The app as gunicorn serves it (`tests.crashapp:app()`), with one job more for tests/test_crashes.py: add_credit
slowed down to a quarter second per chunk of 5, so that a test can kill the worker running a task between two of its
chunks' transactions; and for that job only, the moment between a task's last commit and its `incr` of the job's
running sum widened to a second, so that a test can kill a worker inside it. A worker entering that second says so
with a file named `<job id>.<pid>` in `$CRASH_SIGNALS` (the test's own directory): the test kills that very process
on the file, instead of guessing the moment from the records it polls through the emulator."""
import dataclasses
import os
import time
from pathlib import Path

import main
from accounts.service import ADD_CREDIT
from mapper import completion
from mapper import jobs as mapper_jobs

CHUNK_SECONDS = 0.25
INCR_DELAY = 1.0
SIGNALS = os.environ.get("CRASH_SIGNALS")


def _slow_credit(accounts, params, prepared):
    time.sleep(CHUNK_SECONDS)
    return ADD_CREDIT.apply(accounts, params, prepared)


SLOW_CREDIT = dataclasses.replace(ADD_CREDIT, name="test_slow_credit", apply=_slow_credit, chunk=5,
                                  chunk_firestore=None)
_maybe_finish = completion.maybe_finish


def _late_finish(job, returned):
    if job.name == SLOW_CREDIT.name and returned:
        if SIGNALS:
            Path(SIGNALS, f"{job.id}.{os.getpid()}").touch()
        time.sleep(INCR_DELAY)
    return _maybe_finish(job, returned)


completion.maybe_finish = _late_finish


def app():
    application = main.create_app()
    mapper_jobs.register(application, SLOW_CREDIT)
    return application
