"""The planner: "Numbers Everyone Should Know" turned into answers before a design is built. Each planner is a plain
function from a few whole numbers to a `Plan` (planner/figures.py), one module a planner. Here: what each takes,
every number with its bound, and `plan`, which checks the inputs and answers.
"""
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accounts.credit import ADD_CREDIT
from core import production_latency
from core.errors import Unprocessable
from core.validate import whole_number
from mapper.service import MAX_FANOUT, MAX_PAGE_SIZE, MIN_FANOUT
from planner import batch, blog, comments, counter, request
from planner.figures import BACKENDS, PER, PROFILES, Plan, Rate

# --- the planners' inputs: one bound for every number, so no input makes a planner loop or allocate much -------------


@dataclass(frozen=True)
class Number:
    name: str
    label: str
    low: int
    high: int
    default: int | None = None  # None: required
    rate: bool = False  # so many a second, a minute or an hour (figures.PER): sent as <name>_per_<unit>, one of them

    def fields(self) -> tuple[str, ...]:
        """The names the inputs may give it by: its own, or a rate's in each unit."""
        return tuple(f"{self.name}_per_{per}" for per in PER) if self.rate else (self.name,)


@dataclass(frozen=True)
class Choice:
    name: str
    label: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class Planner:
    name: str
    title: str
    question: str
    numbers: tuple[Number, ...]
    choices: tuple[Choice, ...]
    example: dict[str, Any]  # what its form shows first: the lesson's worked example (docs/lessons/numbers.md)
    rpcs: bool = False  # takes {"rpcs": {method: count}}


BACKEND = Choice("backend", "Backend", BACKENDS)
PROFILE = Choice("profile", "Latency profile", PROFILES)
RPC_METHODS = tuple(production_latency.DATASTORE)
MOST_RPCS = 1000
MOST_REQUEST_ID = 2**63 - 1  # Appstats numbers requests from the time in microseconds (appstats/captures.py)
PLANNERS = {p.name: p for p in (
    Planner("counter", "A counter", "How many shards, and what does each increment and total cost?",
            (Number("writes", "Writes at peak", 1, 1_000_000, rate=True),
             Number("peak_seconds", "How long the peak lasts, s", 1, 604_800)), (BACKEND, PROFILE),
            {"writes_per_second": 50, "peak_seconds": 600}),
    Planner("blog", "A blog or feed", "What does a page cost by index and by offset, and how well can and must the "
            "front page cache?",
            (Number("entries", "Entries", 1, 10**10), Number("depth", "Depth of the page read, entries", 0, 10**10),
             Number("readers", "Front page views", 1, 10**7, rate=True),
             Number("read_budget", "Read budget, reads", 1, 10**9, rate=True),
             Number("posts", "Posts", 0, 1_000_000, default=1, rate=True)), (PROFILE,),
            {"entries": 10_000, "depth": 5_000, "readers_per_second": 100, "read_budget_per_second": 50,
             "posts_per_hour": 6}),
    Planner("comments", "Comments on one entry", "Per-user groups or one shared parent?",
            (Number("comments", "Comments on one entry", 1, 1_000_000, rate=True),
             Number("writers", "People writing them", 1, 10**9)), (BACKEND, PROFILE),
            {"comments_per_second": 20, "writers": 200}),
    Planner("request", "A request", "How long does it wait, and what is it billed, as if served in production?",
            (Number("cache_calls", "Cache calls", 0, MOST_RPCS, default=0),
             Number("reads", "Billed reads", 0, 10**9, default=0),
             Number("writes", "Billed writes", 0, 10**9, default=0),
             Number("deletes", "Billed deletes", 0, 10**9, default=0)), (PROFILE,),
            {"rpcs": {"RunQuery": 1}, "cache_calls": 2, "reads": 11}, rpcs=True),
    Planner("batch", "A batch job over a kind", "The mapper's fan-out, one cursor walk, or a batch pipeline?",
            (Number("entities", "Entities", 1, 10**10), Number("page_size", "Page size", 1, MAX_PAGE_SIZE,
                                                                 default=ADD_CREDIT.page_size),
             Number("fanout", "Fan-out", MIN_FANOUT, MAX_FANOUT, default=ADD_CREDIT.fanout),
             Number("instances", "Tasks at once", 1, 100_000, default=8)), (BACKEND, PROFILE),
            {"entities": 10_000}),
)}
FUNCTIONS: dict[str, Callable[..., Plan]] = {
    "counter": counter.plan_counter, "blog": blog.plan_blog, "comments": comments.plan_comments,
    "request": request.plan_request, "batch": batch.plan_batch}


def _rpcs(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        raise Unprocessable("rpcs must be an object of RPC counts by method, e.g. {\"Lookup\": 1}.", "bad_rpcs")
    unknown = sorted(set(value) - set(RPC_METHODS))
    if unknown:
        raise Unprocessable(f"rpcs takes the methods {', '.join(RPC_METHODS)}; not {', '.join(unknown)[:200]}.",
                            "bad_rpcs")
    return {method: whole_number(value[method], "rpcs", 0, MOST_RPCS, from_json=True) for method in value}


def plan(planner: object, inputs: object) -> dict[str, Any]:
    """The answer of the planner `planner` names to `inputs`, checked first: a 422 naming what is wrong."""
    if not isinstance(planner, str) or planner not in PLANNERS:
        raise Unprocessable(f"planner must be one of {', '.join(PLANNERS)}.", "bad_planner")
    spec = PLANNERS[planner]
    if not isinstance(inputs, dict):
        raise Unprocessable("inputs must be an object.", "bad_inputs")
    known = {f for n in spec.numbers for f in n.fields()} | {c.name for c in spec.choices} | (
        {"rpcs"} if spec.rpcs else set())
    if spec.rpcs and "appstats" in inputs:
        known = {"appstats", *(c.name for c in spec.choices)}  # the record says the rest
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise Unprocessable(f"The {planner} planner takes {', '.join(sorted(known))}; not {', '.join(unknown)[:200]}.",
                            "bad_inputs")
    args: dict[str, Any] = {}
    for number in spec.numbers:
        given = [field for field in number.fields() if field in inputs]
        if len(given) > 1:
            raise Unprocessable(f"Give {number.name} once: one of {', '.join(given)}.", f"bad_{number.name}")
        if not given and number.default is not None:
            count, per = number.default, "second"
        else:  # absent and required (named as a second's), or present (null included: the document says a number)
            field = given[0] if given else number.fields()[0]
            count = whole_number(inputs.get(field), field, number.low, number.high, from_json=True)
            per = field.rpartition("_per_")[2]
        args[number.name] = Rate(count, per) if number.rate else count
    for choice in spec.choices:
        value = inputs.get(choice.name, choice.options[0])
        if not isinstance(value, str) or value not in choice.options:
            raise Unprocessable(f"{choice.name} must be one of {', '.join(choice.options)}.", f"bad_{choice.name}")
        args[choice.name] = value
    if spec.rpcs and "appstats" in inputs:  # a recorded request: its calls and bill come from its record
        return request.plan_recorded(whole_number(inputs["appstats"], "appstats", 1, MOST_REQUEST_ID, from_json=True),
                                     args["profile"]).as_dict()
    if spec.rpcs:
        args["rpcs"] = _rpcs(inputs.get("rpcs", {}))
    if planner == "blog" and args["depth"] >= args["entries"]:
        raise Unprocessable("depth must be less than entries: the page read starts that many below the newest.",
                            "bad_depth")
    return FUNCTIONS[planner](**args).as_dict()
