"""The deploy files as `gcloud app deploy` reads them (the Cloud SDK's own parser, devstack/deployfiles.py), and every
route the app serves reachable through app.yaml's handlers, in the order App Engine tries them."""
import re

import pytest
from google.cloud import ndb

from core import runtime, tasks
from core.settings import Settings
from devstack import deployfiles
from devstack.services import REPO, DevstackError


@pytest.fixture(scope="module")
def deployed():
    parsed, warnings = deployfiles.parse()
    return parsed, warnings


def _handler_for(path, handlers):
    """The handler App Engine serves `path` with: the first whose url matches (a static_dir's url is a prefix, a
    script's a regular expression matched against the whole path)."""
    for handler in handlers:
        if handler["static_dir"] is not None:
            if path.startswith(handler["url"].rstrip("/") + "/"):
                return handler
        elif re.fullmatch(handler["url"], path):
            return handler
    return None


def _sample_path(rule):
    return re.sub(r"<(?:int:)?[^<>]+>", lambda m: "0" if m.group(0).startswith("<int:") else "x", rule.rule)


def unreachable(app, handlers):
    """The app's routes App Engine would not hand to the app (or, for its static files, to the static handler)."""
    missing = []
    for rule in app.url_map.iter_rules():
        path = _sample_path(rule)
        handler = _handler_for(path, handlers)
        wanted = "static_dir" if rule.endpoint == "static" else "script"
        if handler is None or handler[wanted] is None:
            missing.append(f"{rule.rule} ({rule.endpoint})")
    return missing


def test_gcloud_reads_the_deploy_files_without_a_warning(deployed):
    parsed, warnings = deployed
    assert warnings == ""
    assert parsed["runtime"] == "python313"
    assert "gunicorn" in parsed["entrypoint"] and "main:app" in parsed["entrypoint"]
    assert parsed["automatic_scaling"]  # a ceiling on instances, set on purpose
    assert all(h["secure"] == "always" for h in parsed["handlers"])


def test_every_route_reaches_the_app_through_app_yaml(deployed, app):
    parsed, _ = deployed
    assert unreachable(app, parsed["handlers"]) == []
    static = next(h for h in parsed["handlers"] if h["static_dir"])
    assert (REPO / static["static_dir"]).resolve() == REPO.joinpath(app.static_folder).resolve()
    assert app.static_url_path == static["url"]


def test_a_route_app_yaml_does_not_hand_to_the_app_is_found(app):
    only_static_and_blog = [{"url": "/static", "static_dir": "static", "script": None},
                            {"url": "/blog.*", "static_dir": None, "script": "auto"}]
    missing = unreachable(app, only_static_and_blog)
    assert "/healthz (core.healthz)" in missing and not any(m.startswith("/blog") for m in missing)


def test_app_yaml_names_every_setting_app_engine_needs(deployed):
    parsed, _ = deployed
    names = set(parsed["env_variables"])
    assert {"SECRET_KEY", "ADMIN_EMAILS", "IAP_AUDIENCE", "REDIS_URL", "MEMCACHED_HOSTS", "TASKS_LOCATION",
            "TASKS_QUEUE", "TRUSTED_HOSTS"} <= names
    deployfiles.check_settings(parsed)
    env = dict.fromkeys(names, "") | {"GAE_ENV": "standard", "SECRET_KEY": "s", "TASKS_LOCATION": "us-central1",
                                      "TASKS_QUEUE": "mapper", "REDIS_URL": "redis://10.0.0.3:6379/0"}
    settings = Settings.from_env(env)
    assert settings.backend == "firestore" and settings.tasks_location == "us-central1"
    assert settings.tasks_emulator_host is None  # Cloud Tasks itself, whatever the environment says
    assert settings.redis_url and not settings.memcached_hosts


def test_index_yaml_and_queue_yaml_match_the_app(deployed, app):
    parsed, _ = deployed
    kinds = {index["kind"] for index in parsed["indexes"]}
    assert kinds and kinds <= set(ndb.Model._kind_map), kinds - set(ndb.Model._kind_map)
    queue = next(q for q in parsed["queues"] if q["name"] == runtime.of(app).settings.tasks_queue)
    assert queue["retry_limit"] == tasks.MAX_ATTEMPTS  # the handler records a failure on the last delivery


def test_trusted_hosts_the_app_would_refuse_stop_the_deploy(tmp_path):
    for name in deployfiles.DEPLOYED:
        (tmp_path / name).write_text((REPO / name).read_text())
    app_yaml = (REPO / "app.yaml").read_text().replace('TRUSTED_HOSTS: ""', 'TRUSTED_HOSTS: ".example.com,a b"')
    (tmp_path / "app.yaml").write_text(app_yaml)
    parsed, _ = deployfiles.parse(tmp_path)
    with pytest.raises(DevstackError, match="TRUSTED_HOSTS"):
        deployfiles.check_settings(parsed)


def test_a_broken_app_yaml_is_refused(tmp_path):
    for name in deployfiles.DEPLOYED:
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / "app.yaml").write_text((REPO / "app.yaml").read_text().replace("script: auto", "scripts: auto"))
    with pytest.raises(DevstackError, match="gcloud's parser refused"):
        deployfiles.parse(tmp_path)
