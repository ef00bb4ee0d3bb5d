"""The app as gunicorn serves it (`tests.crashapp:app()`), with one job more for tests/test_crashes.py: add_credit
slowed down to a quarter second per chunk of 5, so that a test can kill the worker running a task between two of its
chunks' transactions; and for that job only, the moment between a task's last commit and its `incr` of the job's
running sum widened to a second, so that a test can kill a worker inside it. A worker entering that second says so
with a file named `<job id>.<pid>` in `$CRASH_SIGNALS` (the test's own directory): the test kills that very process
on the file, instead of guessing the moment from the records it polls through the emulator.

The same job has an on_done that writes one CrashFollowUp under the job (so a test counts the runs that committed),
and the moment between its finishing commit and the enqueue of that follow-up (the finisher's, not the sweep's
resends) is widened to FOLLOW_UP_DELAY, announced by a file `follow-<job id>.<pid>`.

And a worker that dies between a write's commit and its answer, every time: the first increment of a counter, and
the first post to a blog, whose name starts with DIE_AFTER_COMMIT SIGKILLs its own worker once the write committed,
before it answers (the first only: a file `<name>.died` in `$CRASH_SIGNALS` says it happened). The client sees its
connection cut and sends the write again with its key."""
import dataclasses
import functools
import os
import signal
import time
from pathlib import Path

from google.cloud import ndb

import main
from accounts.credit import ADD_CREDIT
from blog import service as blog_service
from counters import service as counters_service
from mapper import completion
from mapper import jobs as mapper_jobs

CHUNK_SECONDS = 0.25
INCR_DELAY = 1.0
FOLLOW_UP_DELAY = 2.0
SIGNALS = os.environ.get("CRASH_SIGNALS")


def _slow_credit(accounts, params, prepared):
    """add_credit through ndb's models, each chunk after CHUNK_SECONDS (in its transaction): a delivery is long enough
    to be killed half way. (add_credit_increments, written as protobufs, is killed in tests/test_crashes.py too.)"""
    time.sleep(CHUNK_SECONDS)
    for account in accounts:
        account.balance += params["amount"]
    return accounts


class CrashFollowUp(ndb.Model):
    """One per run of test_slow_credit's on_done that committed, under ndb.Key("Job", <job id>)."""


def _follow_up(job):
    return [CrashFollowUp(parent=ndb.Key("Job", job.id))]


SLOW_CREDIT = dataclasses.replace(ADD_CREDIT, name="test_slow_credit", apply=_slow_credit,
                                  per_transaction=5, per_transaction_firestore=None, on_done=_follow_up)
_end_if_all_back = completion.end_if_all_back


def _late_finish(job, returned):
    if job.name == SLOW_CREDIT.name and returned:
        if SIGNALS:
            Path(SIGNALS, f"{job.id}.{os.getpid()}").touch()
        time.sleep(INCR_DELAY)
    return _end_if_all_back(job, returned)


completion.end_if_all_back = _late_finish
_follow_up_after_commit = completion.send_follow_up


def _late_follow_up(job):
    if job.name == SLOW_CREDIT.name and job.follow_up == "pending" and job.follow_up_sent == 0:
        if SIGNALS:
            Path(SIGNALS, f"follow-{job.id}.{os.getpid()}").touch()
        time.sleep(FOLLOW_UP_DELAY)
    return _follow_up_after_commit(job)


completion.send_follow_up = _late_follow_up


DIE_AFTER_COMMIT = "die-after-commit-"


def _dies_after_its_first_commit(write):
    """`write(name, ...)`, and for a name starting with DIE_AFTER_COMMIT, the first time, this worker killed after it
    returned (its commit done) and before the request is answered."""
    @functools.wraps(write)
    def written(name, *args, **kwargs):
        result = write(name, *args, **kwargs)
        if SIGNALS and name.startswith(DIE_AFTER_COMMIT):
            try:
                Path(SIGNALS, f"{name}.died").touch(exist_ok=False)  # atomic: the first write of the name only
            except FileExistsError:
                return result
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return written


counters_service.increment = _dies_after_its_first_commit(counters_service.increment)
blog_service.post_entry = _dies_after_its_first_commit(blog_service.post_entry)


def app():
    application = main.create_app()
    mapper_jobs.register(application, SLOW_CREDIT)
    return application
