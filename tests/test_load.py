"""`make load` (bench/load.py) against the app served on loopback: the real Locust, briefly, each scenario's variants
run and measured, and what the counters scenario acknowledged found again in the shards."""
import os

import pytest

from bench import load
from core import runtime
from devstack import serving
from tests.support import make_app


@pytest.fixture
def site(stack):
    fresh = stack.fresh()
    with serving.served(lambda tasks_env: make_app(stack, **tasks_env, **fresh)) as (app, url):
        runtime.of(app).cache.flush()
        yield url
    app.extensions["contract"].assert_kept()


def test_the_load_kit_measures_every_scenario_and_loses_no_increment(site, tmp_path, capsys):
    out = tmp_path / "load"
    load.main(["--url", site, "--users", "4", "--seconds", "3", "--rounds", "1", "--out", str(out)])
    report = (tmp_path / "load.md").read_text()
    # whose waits its times are: the tests' app waits a profile's only when LATENCY names one
    latency = os.environ.get("LATENCY", "none") or "none"
    assert (f"(LATENCY={latency}, " if latency != "none" else "waits no modelled round trips") in report, report
    for ratio in ("sharded / one entity", "adaptive / one entity", "cached / uncached", "designed / shared"):
        assert f"- {ratio}: **" in report
    acknowledged = [line for line in report.splitlines() if "acknowledged" in line]
    assert len(acknowledged) == 3 and not any("LOST" in line for line in acknowledged), report
    assert all(int(line.split(": ")[1].split()[0].replace(",", "")) > 0 for line in acknowledged), report
    # each variant's bill in production: the cached page bills nothing, the bypassed one reads, an increment writes
    bills = {cells[1].strip(): cells[5].strip() for cells in (line.split("|") for line in report.splitlines()
                                                              if line.startswith("| ") and "variant" not in line)}
    assert bills["cached"].startswith("nothing") and "read" in bills["uncached"], bills
    assert all("write" in bills[v] for v in ("one entity", "sharded", "adaptive", "designed", "shared")), bills
    rows = (tmp_path / "load.csv").read_text().splitlines()
    assert rows[0].startswith("scenario,variant,round") and len(rows) == 1 + 3 + 2 + 2
    served = {row.split(",")[1]: float(row.split(",")[3]) for row in rows[1:]}
    assert all(v > 0 for v in served.values()), served  # every variant was served, cached and bypassed alike


@pytest.mark.parametrize("argv,message", [
    (["--users", "65"], "must be 1 to 64"), (["--seconds", "301"], "must be 3 to 300"),
    (["--rounds", "0"], "must be 1 to 5"), (["--scenario", "nope"], "unknown scenario nope"),
])
def test_the_load_kit_is_bounded(argv, message, capsys):
    with pytest.raises(SystemExit):
        load.main(["--url", "http://127.0.0.1:9"] + argv)
    assert message in capsys.readouterr().err


def test_the_load_kit_says_when_nothing_answers(capsys):
    from devstack import free_port
    with pytest.raises(SystemExit, match="does not answer /healthz"):
        load.main(["--url", f"http://127.0.0.1:{free_port()}", "--seconds", "3", "--rounds", "1"])
