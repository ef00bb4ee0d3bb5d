"""Exactly once, written once (docs/lessons/exactly-once.md): a Datastore commit can answer UNKNOWN, or time out, and
yet have applied; its retry must not apply the effect again, and must still do what was to follow the commit.

Each call that must take effect once is a `Call`, whose id (its *stamp*) is written in the same commit as the effect,
and `once` (below) tells what a retry finds: nothing (this call WROTE it now), its own earlier commit (MINE) or
another call's (ANOTHERS). Every such write (not simple.py's, the talk's) goes through `once`: only it compares stamps.
"""
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from core.transactions import transact

T = TypeVar("T")
S = TypeVar("S")

# Which of three `once` found: nothing written yet, so this call WROTE it now; this call's own earlier commit (MINE);
# another call's (ANOTHERS).
WROTE, MINE, ANOTHERS = "wrote", "mine", "another's"


class Call:
    """One execution of code whose effect must happen once: its `id` is the stamp `once` writes with the effect. Made
    once and shared by every attempt of the commit (an attempt that collided, or answered UNKNOWN, is tried again with
    the same call, so its retry can tell its own earlier commit from another call's)."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex


@dataclass(frozen=True)
class Written:
    """What `look` returns when the effect is written already: the stamp written with it (None for a write that
    carried none) and what to answer from it."""
    stamp: str | None
    answer: Any = None


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """Which of the three `once` found (WROTE, MINE or ANOTHERS), and the answer: `write`'s, else `Written.answer`."""
    found: str
    value: T

    @property
    def wrote(self) -> bool:
        """This call wrote the effect now (`write`'s value)."""
        return self.found == WROTE

    @property
    def by_another(self) -> bool:
        """ANOTHERS: another call (a resend, another delivery) applied it; this one answers that one's answer."""
        return self.found == ANOTHERS


def once(look: Callable[[], "Written | S"], write: Callable[[S, str], T], then: Callable[[T], None] | None = None,
         call: Call | None = None, run: Callable[[Callable[[], Outcome[T]]], Outcome[T]] | None = None,
         **options: Any) -> Outcome[T]:
    """The protocol, in one transaction (`run`, else core.transactions.transact with `options`: `hot_key`...):
    1. `look()` reads what the effect would change and says whether the effect is written, from the effect's own
       entities (the marker exists, the record moved on, the job ended): a `Written` when it is, else whatever state
       `write` needs (what it read). Never from the stamp: a write that carried no stamp is then another's, not
       "nothing written".
    2. Nothing written: `write(state, stamp)` writes the effect and the stamp in the same commit (WROTE).
       Written, with this call's stamp: its own earlier commit answered UNKNOWN, or timed out, and applied (MINE).
       Written with another stamp: another call's (ANOTHERS). Neither writes again.
    3. After the commit, `then(value)` for WROTE and MINE (what was to follow this call's commit: a cached total's
       incr, a task to queue), which a MINE's first attempt never reached; never for ANOTHERS, whose own call did it.
    `call`: given when the attempts are made outside `run` (a sharded counter's retry loop), else one is made here.
    """
    call = call or Call()

    def txn() -> Outcome[T]:
        state = look()
        if isinstance(state, Written):
            return Outcome(MINE if state.stamp == call.id else ANOTHERS, state.answer)
        return Outcome(WROTE, write(state, call.id))

    outcome = run(txn) if run is not None else transact(txn, **options)
    if then is not None and outcome.found != ANOTHERS:
        then(outcome.value)
    return outcome
