"""The Locust user `make load` runs (bench/load.py starts it headless, one variant at a time, and reads its CSV).

Each simulated user sends one request over and over with no think time, the way the in-process benchmarks' writers
do: what is measured is how many requests the deployment serves, and how many it refuses, under that load. What to
send comes from the environment bench/load.py sets (LOAD_SPEC, JSON): the method, path and body, and the identities to
send it as (one set of headers per identity: each user takes the next, so a scenario can give every user its own).
"""
import itertools
import json
import os

from locust import FastHttpUser, constant, events, task

_SPEC = json.loads(os.environ.get("LOAD_SPEC") or '{"name": "healthz", "method": "GET", "path": "/healthz"}')
_next_identity = itertools.count()
# Every answer this process saw, counted as it arrives (Locust's CSV is written on an interval, so its last rows can
# miss the final second): bench/load.py holds the app's own counts to these.
_tally = {"served": 0, "refused": 0}


@events.quitting.add_listener
def _write_tally(environment, **_):
    if os.environ.get("LOAD_TALLY"):
        with open(os.environ["LOAD_TALLY"], "w") as f:
            json.dump(_tally, f)


class Hammer(FastHttpUser):
    """One request, again and again, as one identity."""
    wait_time = constant(0)

    def on_start(self):
        identities = _SPEC.get("identities") or [{}]
        self.headers = identities[next(_next_identity) % len(identities)]

    @task
    def hit(self):
        with self.client.request(_SPEC["method"], _SPEC["path"], json=_SPEC.get("body"), headers=self.headers,
                                 name=_SPEC["name"], catch_response=True) as response:
            if response.status_code >= 400:
                # A refusal (503: too contended, try again) is what an overloaded design answers: counted as a
                # failure, so requests/s minus failures/s is what the deployment actually served.
                response.failure(f"HTTP {response.status_code}")
                _tally["refused"] += 1
            else:
                _tally["served"] += 1
