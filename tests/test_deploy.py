"""The deploy files as `gcloud app deploy` reads them (the Cloud SDK's own parser, devstack/deployfiles.py), and every
route the app serves reachable through app.yaml's handlers, in the order App Engine tries them."""
import re

import pytest
from google.cloud import ndb

from core import runtime, tasks
from core.settings import Settings, with_secret_key
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


# app.yaml as a user fills it in for a project with a Valkey instance behind a connector (docs/deploy.md).
SHIPPED_CONNECTOR = ("# vpc_access_connector:\n#   name: projects/PROJECT_ID/locations/REGION/connectors/CONNECTOR\n"
                     "#   egress_setting: private-ranges-only")
CONNECTOR = ("vpc_access_connector:\n  name: projects/p/locations/us-central1/connectors/c\n"
             "  egress_setting: private-ranges-only")
CLIENT_ID = "123456789-abcdef.apps.googleusercontent.com"
FILLED = {'GOOGLE_CLIENT_ID: ""': f'GOOGLE_CLIENT_ID: "{CLIENT_ID}"',
          'TASKS_LOCATION: ""': 'TASKS_LOCATION: "us-central"',
          'REDIS_URL: ""': 'REDIS_URL: "redis://10.0.0.3:6379/0"', SHIPPED_CONNECTOR: CONNECTOR}


def _deploy_folder(tmp_path, changes=FILLED, then=None, **extra):
    """A copy of the deploy files and .gcloudignore in `tmp_path`, app.yaml changed by `changes` and `then` (each must
    apply), with `extra` files (name: text) beside them."""
    for name in (*deployfiles.DEPLOYED, ".gcloudignore"):
        (tmp_path / name).write_text((REPO / name).read_text())
    app_yaml = (REPO / "app.yaml").read_text()
    for old, new in [*changes.items(), *(then or {}).items()]:
        assert old in app_yaml, old
        app_yaml = app_yaml.replace(old, new)
    (tmp_path / "app.yaml").write_text(app_yaml)
    for name, text in extra.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_app_yaml_names_every_setting_app_engine_needs(deployed, tmp_path):
    parsed, _ = deployed
    names = set(parsed["env_variables"])
    assert {"SECRET_KEY_SECRET", "ADMIN_EMAILS", "GOOGLE_CLIENT_ID", "REDIS_URL", "MEMCACHED_HOSTS", "TASKS_LOCATION",
            "TASKS_QUEUE", "TRUSTED_HOSTS"} <= names
    assert "SECRET_KEY" not in names  # the key is in Secret Manager, never in the version's configuration
    assert parsed["inbound_services"] == ["warmup"] and parsed["max_concurrent_requests"] == 16
    filled, _ = deployfiles.parse(_deploy_folder(tmp_path))
    deployfiles.check_settings(filled)  # filled in as docs/deploy.md says: nothing refused
    env = filled["env"] | {"GAE_ENV": "standard", "SECRET_KEY": "s" * 32}
    settings = Settings.from_env(env)
    assert settings.backend == "firestore" and settings.tasks_location == "us-central1"  # App Engine's us-central
    assert settings.tasks_emulator_host is None  # Cloud Tasks itself, whatever the environment says
    assert settings.redis_url and not settings.memcached_hosts
    assert settings.google_client_id == CLIENT_ID and settings.sign_in_offered and not settings.dev_signin


def test_the_shipped_app_yaml_is_refused_until_its_region_is_set(deployed):
    parsed, _ = deployed
    with pytest.raises(DevstackError, match="set TASKS_LOCATION to the app's region"):
        deployfiles.check_settings(parsed)


@pytest.mark.parametrize("change, refusal", [
    ({'TASKS_LOCATION: "us-central"': 'TASKS_LOCATION: "Iowa"'}, "set TASKS_LOCATION to the app's region"),
    ({f'GOOGLE_CLIENT_ID: "{CLIENT_ID}"': 'GOOGLE_CLIENT_ID: ""'}, "GOOGLE_CLIENT_ID must be set on App Engine"),
    ({f'GOOGLE_CLIENT_ID: "{CLIENT_ID}"': 'GOOGLE_CLIENT_ID: "/projects/1/apps/p"'}, "is not an OAuth client id"),
    ({CONNECTOR: ""}, "REDIS_URL is set but there is no vpc_access_connector"),
    ({'SECRET_KEY_SECRET: "app-secret-key"': 'SECRET_KEY_SECRET: ""'}, "set SECRET_KEY_SECRET"),
    ({'SECRET_KEY_SECRET: "app-secret-key"': 'SECRET_KEY_SECRET: "no such/thing"'}, "is not a secret's name"),
    ({'SECRET_KEY_SECRET: "app-secret-key"': 'SECRET_KEY_SECRET: ""\n  SECRET_KEY: "k"'},
     "remove SECRET_KEY from env_variables"),
    ({'MEMCACHED_HOSTS: ""': 'MEMCACHED_HOSTS: "10.0.0.4:11211"'}, "Set MEMCACHED_HOSTS or REDIS_URL, not both"),
    ({'REDIS_URL: "redis://10.0.0.3:6379/0"': 'REDIS_URL: "10.0.0.3:6379"'}, "REDIS_URL must be a redis://"),
    ({'REDIS_URL: "redis://10.0.0.3:6379/0"': 'REDIS_URL: ""', CONNECTOR: "",
      'MEMCACHED_HOSTS: ""': 'MEMCACHED_HOSTS: "10.0.0.4:11211"'},
     "MEMCACHED_HOSTS is set but there is no vpc_access_connector"),
])
def test_make_deploy_refuses_a_configuration_that_would_not_work(tmp_path, change, refusal):
    parsed, _ = deployfiles.parse(_deploy_folder(tmp_path, then=change))
    with pytest.raises(DevstackError, match=refusal):
        deployfiles.check_settings(parsed)


def test_the_upload_leaves_out_the_secret_and_every_virtualenv(tmp_path):
    folder = _deploy_folder(tmp_path, **{"secret.yaml": "env_variables:\n  SECRET_KEY: 'x'\n",
                                         ".venv-3.13/lib/site.py": "", ".venv/bin/python": "", "main.py": ""})
    parsed, _ = deployfiles.parse(folder)
    assert "main.py" in parsed["upload"] and "app.yaml" in parsed["upload"]
    assert [name for name in parsed["upload"] if "secret" in name or name.startswith(".venv")] == []
    deployfiles.check_settings(parsed)
    # The same folder with a .gcloudignore that forgot the secret is refused.
    (folder / ".gcloudignore").write_text((folder / ".gcloudignore").read_text().replace("\nsecret.yaml\n", "\n"))
    with pytest.raises(DevstackError, match="would include secret.yaml"):
        deployfiles.check_settings(deployfiles.parse(folder)[0])


def test_a_folder_without_its_gcloudignore_is_refused_and_left_as_it_was(tmp_path):
    folder = _deploy_folder(tmp_path)
    (folder / ".gcloudignore").unlink()
    parsed, warnings = deployfiles.parse(folder)
    assert parsed["upload"] is None and not (folder / ".gcloudignore").exists() and warnings == ""
    with pytest.raises(DevstackError, match="There is no .gcloudignore"):
        deployfiles.check_settings(parsed)


def test_an_upload_over_app_engines_file_limit_is_refused(tmp_path):
    folder = _deploy_folder(tmp_path)
    many = folder / "node_modules"
    many.mkdir()
    for i in range(deployfiles.MAX_UPLOAD_FILES):
        (many / f"{i}.js").touch()
    parsed, _ = deployfiles.parse(folder)
    assert len(parsed["upload"]) > deployfiles.MAX_UPLOAD_FILES
    with pytest.raises(DevstackError, match=r"over App Engine's 10,000 a version.*largest folders: node_modules"):
        deployfiles.check_settings(parsed)


def test_index_yaml_and_queue_yaml_match_the_app(deployed, app):
    parsed, _ = deployed
    kinds = {index["kind"] for index in parsed["indexes"]}
    assert kinds and kinds <= set(ndb.Model._kind_map), kinds - set(ndb.Model._kind_map)
    queue = next(q for q in parsed["queues"] if q["name"] == runtime.of(app).settings.tasks_queue)
    assert queue["retry_limit"] == tasks.MAX_ATTEMPTS  # the handler records a failure on the last delivery


def test_trusted_hosts_the_app_would_refuse_stop_the_deploy(tmp_path):
    folder = _deploy_folder(tmp_path, then={'TRUSTED_HOSTS: ""': 'TRUSTED_HOSTS: ".example.com,a b"'})
    with pytest.raises(DevstackError, match="TRUSTED_HOSTS"):
        deployfiles.check_settings(deployfiles.parse(folder)[0])


def test_a_broken_app_yaml_is_refused(tmp_path):
    for name in deployfiles.DEPLOYED:
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / "app.yaml").write_text((REPO / "app.yaml").read_text().replace("script: auto", "scripts: auto"))
    with pytest.raises(DevstackError, match="gcloud's parser refused"):
        deployfiles.parse(tmp_path)


def test_make_deploy_waits_for_every_index_that_is_not_ready():
    # As `gcloud datastore indexes list --format=json` lists them (fields of the Datastore Admin API's Index)
    listed = [{"indexId": "a", "kind": "CounterShard", "state": "READY"},
              {"indexId": "b", "kind": "Comment", "state": "CREATING"},
              {"indexId": "c", "kind": "Job", "state": "ERROR"}]
    assert deployfiles.indexes_not_ready(listed) == ["Comment (CREATING)", "Job (ERROR)"]
    assert deployfiles.indexes_not_ready(listed[:1]) == [] and deployfiles.indexes_not_ready([]) == []
    deploy = (REPO / "Makefile").read_text().split("\ndeploy:", 1)[1].split("\n\n", 1)[0].splitlines()
    steps = [line.strip() for line in deploy[1:]]
    # the indexes first, READY before the app that queries them
    wait = steps.index("$(PY) -m devstack.deployfiles --wait-for-indexes")
    assert (steps.index("$(PY) -m devstack.deployfiles --secret-key") < steps.index("gcloud app deploy index.yaml")
            < wait < steps.index("gcloud app deploy app.yaml queue.yaml"))


# --- SECRET_KEY from Secret Manager --------------------------------------------------------------------------------

class SecretManagerStandIn:
    """Secret Manager's AccessSecretVersion over gRPC on loopback, the real protocol and the client library's own
    transport (Secret Manager has no emulator): `secrets` maps a version's full name to its payload."""

    def __init__(self, secrets):
        from concurrent import futures

        import grpc
        from google.cloud import secretmanager
        self.secrets, self.calls = secrets, []

        def access(request, context):
            self.calls.append(request.name)
            if request.name not in self.secrets:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Secret [{request.name}] not found or has no versions.")
            return secretmanager.AccessSecretVersionResponse(
                name=request.name, payload=secretmanager.SecretPayload(data=self.secrets[request.name].encode()))
        method = grpc.unary_unary_rpc_method_handler(
            access, request_deserializer=secretmanager.AccessSecretVersionRequest.deserialize,
            response_serializer=secretmanager.AccessSecretVersionResponse.serialize)
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "google.cloud.secretmanager.v1.SecretManagerService", {"AccessSecretVersion": method}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def client(self):
        import grpc
        from google.cloud import secretmanager
        from google.cloud.secretmanager_v1.services.secret_manager_service.transports import (
            SecretManagerServiceGrpcTransport,
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return secretmanager.SecretManagerServiceClient(transport=SecretManagerServiceGrpcTransport(channel=channel))


@pytest.fixture
def secret_manager():
    stand_in = SecretManagerStandIn({"projects/demo/secrets/app-secret-key/versions/latest": "k" * 64 + "\n"})
    yield stand_in
    stand_in.server.stop(0)


def test_the_session_key_is_read_from_secret_manager_once_at_start(secret_manager):
    env = {"GAE_ENV": "standard", "GOOGLE_CLOUD_PROJECT": "demo", "SECRET_KEY_SECRET": "app-secret-key"}
    read = with_secret_key(env, secret_manager.client())
    assert read["SECRET_KEY"] == "k" * 64 and secret_manager.calls == [
        "projects/demo/secrets/app-secret-key/versions/latest"]
    full = with_secret_key({"SECRET_KEY_SECRET": "projects/demo/secrets/app-secret-key/versions/latest"},
                           secret_manager.client())
    assert full["SECRET_KEY"] == "k" * 64
    assert with_secret_key({"SECRET_KEY": "s"}) == {"SECRET_KEY": "s"}  # nothing to read: no call at all
    assert len(secret_manager.calls) == 2


@pytest.mark.parametrize("env, refusal", [
    ({"SECRET_KEY_SECRET": "other-secret"}, "could not be read from Secret Manager.*not found.*secretAccessor"),
    ({"SECRET_KEY_SECRET": "short"}, "holds 5 characters: a session key needs at least 32"),
    ({"SECRET_KEY_SECRET": "a/b"}, "is not a secret's name"),
    ({"SECRET_KEY_SECRET": "app-secret-key", "SECRET_KEY": "s"}, "Set SECRET_KEY or SECRET_KEY_SECRET, not both"),
])
def test_a_session_key_that_cannot_be_read_stops_the_app_with_what_to_do(secret_manager, env, refusal):
    secret_manager.secrets["projects/demo/secrets/short/versions/latest"] = "12345"
    with pytest.raises(RuntimeError, match=refusal):
        with_secret_key({"GOOGLE_CLOUD_PROJECT": "demo", **env}, secret_manager.client())
