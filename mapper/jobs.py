"""What a mapper job is (JobDefinition), and each app's registry of them: the feature that owns a kind registers its
jobs from its own init_app; the mapper knows none of them, and its tasks carry a run's id, never code."""
import dataclasses
from collections.abc import Callable
from typing import Any

from flask import Flask
from google.cloud import ndb

from core import runtime
from core.errors import Unprocessable
from mapper.models import MapperJob

# The legacy emulator (like Datastore before Firestore) refuses a transaction over more than 25 entity groups; a
# chunk's entities plus the task's record must fit, with room for what a job writes beside each entity.
MAX_GROUPS = 25


@dataclasses.dataclass(frozen=True)
class JobDefinition:
    """A job that can be run over every entity of `kind` (each run of it: a MapperJob).

    `apply(entities, params, prepared)`, the map step, runs in the chunk's transaction and returns the entities to
    write. A job whose apply only adds whole numbers may give them as `increments(params)` ({"balance": 10}) too,
    written instead as protobufs past ndb (the kind must use neither of ndb's caches; mapper/increments.py).
    `prepare(keys, params)` runs before, outside any transaction, for what a transaction may not do (queries without
    an ancestor); its result is apply's `prepared`.
    `per_transaction`: entities a chunk's transaction holds, at most MAX_GROUPS - 1 - the groups apply writes beside
    them. Firestore in Datastore mode has no limit of groups, only 10 MiB a transaction
    (https://cloud.google.com/datastore/docs/concepts/limits): there `per_transaction_firestore`, if given.
    `tally(entities, params)` returns whole numbers by name, added to the task's record in the chunk's transaction (each
    entity counts exactly once); the job's tally is their sum over its records. `settle(tally, params)` returns
    entities to write in the transaction that ends the job, exactly once, instead of each chunk writing a shared one.
    `parse_params(params)` checks the params (Unprocessable: a 422) and returns them as kept; it runs after every
    other check, so it may create what the job needs.
    """
    name: str
    kind: str
    title: str
    description: str
    apply: Callable[[list, dict, Any], list]
    increments: Callable[[dict], dict[str, int]] | None = None
    parse_params: Callable[[dict], dict] = lambda params: _no_params(params)
    prepare: Callable[[list, dict], Any] | None = None
    # After the job ended, by a task of its own: returns entities to write (or None), committed with the mark that
    # it ran, so they land exactly once; it may itself run more than once (completion.run_follow_up).
    on_done: Callable[[MapperJob], list | None] | None = None
    tally: Callable[[list, dict], dict] | None = None
    settle: Callable[[dict, dict], list] | None = None
    fields: tuple = ()  # (name, label, default) of each param, for the jobs page's form
    per_transaction: int = 20
    per_transaction_firestore: int | None = None
    page_size: int = 100
    fanout: int = 4


JOBS = "mapper.jobs"  # the runtime's registry of this app's jobs by name


def _no_params(params: dict[str, Any]) -> dict[str, Any]:
    if params:
        raise Unprocessable("This job takes no params.", "bad_params")
    return {}


def register(app: Flask, definition: JobDefinition) -> JobDefinition:
    """Make the job `definition` one that `app` can run (from the init_app of the feature that owns its kind)."""
    if not 1 <= definition.per_transaction < MAX_GROUPS:
        raise ValueError(f"{definition.name}: a chunk of {definition.per_transaction} does not fit a transaction")
    if definition.per_transaction_firestore is not None and definition.per_transaction_firestore < 1:
        raise ValueError(f"{definition.name}: per_transaction_firestore must be at least 1")
    if definition.increments is not None:
        model = ndb.Model._lookup_model(definition.kind)
        if model._use_cache is not False or model._use_global_cache is not False:  # written past ndb's caches
            raise ValueError(f"{definition.name}: an increments job's kind must use neither of ndb's caches")
    jobs = runtime.of(app).registry(JOBS)
    if definition.name in jobs:
        raise ValueError(f"a job named {definition.name!r} is registered already")
    jobs[definition.name] = definition
    return definition


def of(job: MapperJob) -> JobDefinition | None:
    """The definition `job` runs, or None when this version of the app has none by its name."""
    return runtime.current().registry(JOBS).get(job.name)


def chunk_size(definition: JobDefinition) -> int:
    """The keys of a page in each chunk (one transaction) on this app's backend."""
    if runtime.current().settings.backend == "firestore":
        return definition.per_transaction_firestore or definition.per_transaction
    return definition.per_transaction


def registered() -> dict[str, JobDefinition]:
    return dict(sorted(runtime.current().registry(JOBS).items()))


def definition_of(name: object) -> JobDefinition:
    jobs = runtime.current().registry(JOBS)
    if not isinstance(name, str) or name not in jobs:
        raise Unprocessable(f"There is no job named {name!r}; known: {', '.join(sorted(jobs))}.", "no_such_job")
    return jobs[name]


