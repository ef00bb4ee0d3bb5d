"""The deploy files as `gcloud app deploy` reads them (the Cloud SDK's own parser, devstack/deployfiles.py), and every
route the app serves reachable through app.yaml's handlers, in the order App Engine tries them."""
import json
import re
import subprocess

import pytest
import redis
from google.cloud import ndb

from core import runtime, tasks
from core.cache import make_client
from core.settings import Settings, with_secret_key
from devstack import deployfiles, preflight
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
    """A copy of the deploy files, .gcloudignore and gunicorn.conf.py in `tmp_path`, app.yaml changed by `changes`
    and `then` (each must apply), with `extra` files (name: text) beside them."""
    for name in (*deployfiles.DEPLOYED, ".gcloudignore", "gunicorn.conf.py"):
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
    assert queue["retry"]["task_retry_limit"] == tasks.MAX_DELIVERIES  # the handler records a failure on the last one


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
    steps = _make_deploy_steps()
    # the indexes first, READY before the app that queries them
    wait = steps.index("$(PY) -m devstack.deployfiles --wait-for-indexes")
    assert (steps.index("$(PY) -m devstack.deployfiles --secret-key") < steps.index("gcloud app deploy index.yaml")
            < wait < steps.index("gcloud app deploy app.yaml $(wildcard cron.yaml)"))


def _make_deploy_steps():
    deploy = (REPO / "Makefile").read_text().split("\ndeploy:", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.strip() for line in deploy[1:]]


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
    ({"SECRET_KEY_SECRET": "short"}, "holds 5 bytes: a session key needs at least 32"),
    ({"SECRET_KEY_SECRET": "accented"}, "holds 31 bytes: a session key needs at least 32"),
    ({"SECRET_KEY_SECRET": "a/b"}, "is not a secret's name"),
    ({"SECRET_KEY_SECRET": "app-secret-key", "SECRET_KEY": "s"}, "Set SECRET_KEY or SECRET_KEY_SECRET, not both"),
])
def test_a_session_key_that_cannot_be_read_stops_the_app_with_what_to_do(secret_manager, env, refusal):
    secret_manager.secrets["projects/demo/secrets/short/versions/latest"] = "12345"
    secret_manager.secrets["projects/demo/secrets/accented/versions/latest"] = "é" * 15 + "k"  # 16 characters
    with pytest.raises(RuntimeError, match=refusal):
        with_secret_key({"GOOGLE_CLOUD_PROJECT": "demo", **env}, secret_manager.client())


def test_a_secret_key_is_measured_in_bytes_as_secret_key_itself_is(secret_manager):
    secret_manager.secrets["projects/demo/secrets/wide/versions/latest"] = "é" * 16  # 16 characters, 32 bytes
    read = with_secret_key({"GOOGLE_CLOUD_PROJECT": "demo", "SECRET_KEY_SECRET": "wide"}, secret_manager.client())
    assert read["SECRET_KEY"] == "é" * 16


def test_a_secrets_bare_name_without_a_project_says_which_setting_is_missing(secret_manager):
    with pytest.raises(RuntimeError, match="'app-secret-key' names a secret but GOOGLE_CLOUD_PROJECT is not set"):
        with_secret_key({"SECRET_KEY_SECRET": "app-secret-key"}, secret_manager.client())
    assert secret_manager.calls == []  # refused before any call


# --- make deploy's preflight, on gcloud's recorded answers (tests/fixtures/gcloud/README.md) --------------------------

FIXTURES = REPO / "tests" / "fixtures" / "gcloud"
READY = json.loads((FIXTURES / "ready.json").read_text())
BROKEN = json.loads((FIXTURES / "broken.json").read_text())
VALKEY_CONNECTOR = ("vpc_access_connector:\n  name: projects/demo-project/locations/us-central1/connectors/"
                    "cache-connector\n  egress_setting: private-ranges-only")
# app.yaml filled in for ready.json's project: a Valkey instance with in-transit encryption, behind a connector.
VALKEY = {**FILLED, 'REDIS_URL: ""': 'REDIS_URL: "rediss://10.128.0.5:6379/0"', SHIPPED_CONNECTOR: VALKEY_CONNECTOR,
          'CACHE_CA_FILE: ""': f'CACHE_CA_FILE: "{FIXTURES / "valkey-ca.pem"}"'}


class Recorded:
    """gcloud, answering from recorded answers: `run(args)` is what gcloud printed for that command line (as JSON),
    or its error. A command nobody recorded fails the test: the preflight asks only what the recording holds."""

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def __call__(self, args):
        line = " ".join(args)
        self.asked.append(line)
        assert line in self.answers, f"not recorded: gcloud {line}"
        answer = self.answers[line]
        if "error" in answer:
            raise preflight.GcloudFailed(answer["error"])
        return answer["json"]


@pytest.fixture(scope="module")
def valkey_app_yaml(tmp_path_factory):
    # with the repository's cron.yaml: a ready project is also one that may take its schedules
    return deployfiles.parse(_deploy_folder(tmp_path_factory.mktemp("valkey"), changes=VALKEY,
                                            **{"cron.yaml": (REPO / "cron.yaml").read_text()}))[0]


def test_the_preflight_passes_a_ready_project_having_read_all_of_it(valkey_app_yaml):
    gcloud = Recorded(READY)
    check = preflight.Preflight(valkey_app_yaml, gcloud)
    assert check.check() == []
    assert sorted(set(gcloud.asked)) == sorted(READY)  # every part of the project was read
    preflight.preflight(valkey_app_yaml, Recorded(READY))  # make deploy goes on


REFUSALS = {
    "an API is off": r"APIs not enabled: cloudtasks.googleapis.com .*gcloud services enable cloudtasks",
    "no App Engine app": r"no App Engine app: `gcloud app create --region=REGION`",
    "the app is disabled": r"The App Engine app is USER_DISABLED: enable it again",
    "no database": r"no \(default\) database: `gcloud firestore databases create --location=nam5 "
                   r"--type=datastore-mode`",
    "a Native mode database": r"FIRESTORE_NATIVE, not DATASTORE_MODE.*databases update --type=datastore-mode",
    "the database in another region": r"in eur3, the app in us-central.*databases create --location=nam5",
    "no such connector": r"There is no connector .*connectors create cache-connector --region=us-central1",
    "a connector in ERROR": r"The connector cache-connector is ERROR, not READY",
    "no Valkey instance at REDIS_URL": r"REDIS_URL's address 10.128.0.5 is not the endpoint of a Memorystore for "
                                       r"Valkey",
    "a Valkey instance still creating": r"The Valkey instance cache is CREATING, not ACTIVE",
    "a Valkey instance in cluster mode": r"Cluster Mode Enabled.*--mode=cluster-disabled",
    "a Valkey instance in another network": r"connector is in the network 'default' but cache's endpoint .* valkey-net",
    "a Valkey instance without in-transit encryption": r"in-transit encryption off: REDIS_URL must be redis://",
    "a Valkey instance whose CA is not CACHE_CA_FILE's": r"does not hold 1 of the Valkey instance cache's CA.*"
                                                         r"--save-valkey-ca",
    "a Valkey instance on the shared regional CA": r"does not hold 1 of the Valkey instance cache's CA certificates "
                                                   r"\(GOOGLE_MANAGED_SHARED_CA\)",
    "a Valkey instance on a customer-managed CA": r"does not hold 1 of the Valkey instance cache's CA certificates "
                                                  r"\(CUSTOMER_MANAGED_CAS_CA\)",
    "REDIS_URL naming the reader endpoint": r"REDIS_URL names its reader endpoint \(CONNECTION_TYPE_READER\).*"
                                            r"set REDIS_URL to its primary endpoint, rediss://10.128.0.4:6379/0",
    "a discovery endpoint on a Cluster Mode Disabled instance": r"REDIS_URL names a CONNECTION_TYPE_DISCOVERY "
                                                                r"endpoint, which belongs to Cluster Mode Enabled",
    "no VPC network": r"There is no VPC network 'default'.*`gcloud compute networks create default "
                      r"--subnet-mode=custom`",
    "no firewall rule for Valkey's ports": r"allows TCP 6379, 11000-13047 from the connector's range 10.8.0.0/28.*"
                                           r"firewall-rules create allow-valkey --network=default",
    "a database in OPTIMISTIC_WITH_ENTITY_GROUPS mode": r"concurrencyMode is OPTIMISTIC_WITH_ENTITY_GROUPS: .*25 "
                                                        r"entity groups.*updateMask=concurrencyMode",
    "the Service Consumer Management API off": r"APIs not enabled: serviceconsumermanagement.googleapis.com ",
    "the Cloud Scheduler API off": r"APIs not enabled: cloudscheduler.googleapis.com ",
    "a deployer who may not deploy cron.yaml": r"You deploy as deployer@example.com, which holds none of Owner, "
                                               r"Editor and Cloud Scheduler Admin.*--member=user:deployer@example.com "
                                               r"--role=roles/cloudscheduler.admin",
    "a paused queue": r"The queue mapper is PAUSED.*gcloud tasks queues resume mapper --location=us-central1",
    "a queue disabled by a queue.yaml upload": r"The queue mapper is DISABLED.*queues resume mapper",
    "the app's account without appengine.applications.get": r"demo-project@appspot.gserviceaccount.com lacks "
                                                            r"roles/appengine.appViewer .*appengine.applications.get.*"
                                                            r"--role=roles/appengine.appViewer",
    "the app's account without Datastore": r"lacks roles/datastore.user .*--role=roles/datastore.user",
    "the app's account without the enqueuer role": r"lacks roles/cloudtasks.enqueuer .*--role=roles/cloudtasks",
    "the build's account without a role": r"Cloud Build runs the deploy's build as 123456789012-compute@developer."
                                          r"gserviceaccount.com, which lacks roles/cloudbuild.builds.builder",
}


def test_every_recorded_broken_state_has_its_refusal():
    assert sorted(BROKEN) == sorted(REFUSALS)


@pytest.mark.parametrize("state", sorted(REFUSALS))
def test_the_preflight_refuses_each_broken_state_once_naming_the_fix(valkey_app_yaml, state):
    problems = preflight.Preflight(valkey_app_yaml, Recorded(READY | BROKEN[state])).check()
    assert len(problems) == 1, problems
    assert re.search(REFUSALS[state], problems[0]), problems[0]
    with pytest.raises(DevstackError, match="Not deploying: the project is not ready"):
        preflight.preflight(valkey_app_yaml, Recorded(READY | BROKEN[state]))


@pytest.mark.parametrize("change, refusal", [
    ({"TASKS_LOCATION": "us-east1"}, r"TASKS_LOCATION is 'us-east1' but the app is in us-central: set "
                                     r"TASKS_LOCATION: \"us-central1\""),
    ({"vpc_access_connector": "projects/demo-project/locations/europe-west1/connectors/cache-connector"},
     r"The connector is in europe-west1, the app in us-central: .*connectors create NAME --region=us-central1"),
    ({"REDIS_URL": "redis://10.128.0.5:6379/0", "CACHE_CA_FILE": ""},
     r"in-transit encryption on: REDIS_URL must be rediss://"),
])
def test_the_preflight_refuses_app_yaml_that_does_not_match_the_project(valkey_app_yaml, change, refusal):
    parsed = {**valkey_app_yaml, "env": dict(valkey_app_yaml["env"])}
    for name, value in change.items():
        (parsed if name == "vpc_access_connector" else parsed["env"])[name] = value
    problems = preflight.Preflight(parsed, Recorded(READY)).check()
    assert len(problems) == 1 and re.search(refusal, problems[0]), problems


def test_a_project_without_a_cache_needs_neither_its_apis_nor_a_connector(deployed):
    parsed = {**deployed[0], "env": {**deployed[0]["env"], "TASKS_LOCATION": "us-central1"}}
    answers = {line: answer for line, answer in READY.items() if "memorystore" not in line and "vpc-access" not in line}
    answers["services list --enabled"] = {"json": [s for s in READY["services list --enabled"]["json"]
                                                   if s["config"]["name"] in preflight.APIS | preflight.CRON_APIS]}
    gcloud = Recorded(answers)
    assert preflight.Preflight(parsed, gcloud).check() == []
    assert not any(word in line for line in gcloud.asked for word in ("memorystore", "vpc-access", "compute"))


def test_enable_apis_enables_what_valkey_and_cron_need(valkey_app_yaml):
    enable = "services enable " + " ".join(preflight.Preflight(valkey_app_yaml).needed_apis())
    gcloud = Recorded({enable: {"json": {}}})
    preflight.enable_apis(valkey_app_yaml, gcloud)
    assert {"serviceconsumermanagement.googleapis.com", "cloudscheduler.googleapis.com",
            "compute.googleapis.com"} <= set(gcloud.asked[0].split())
    without_cron = {**valkey_app_yaml, "cron": None}
    assert "cloudscheduler.googleapis.com" not in preflight.Preflight(without_cron).needed_apis()


def test_make_deploy_creates_or_updates_the_queue_from_queue_yaml(deployed):
    parsed = {**deployed[0], "env": {**deployed[0]["env"], "TASKS_LOCATION": "us-central"}}
    flags = ["--max-dispatches-per-second=50", "--max-concurrent-dispatches=32", "--max-attempts=10",
             "--min-backoff=0.1s", "--max-backoff=10s"]
    queue_line = "tasks queues describe mapper --location=us-central1"
    existing = Recorded({queue_line: READY[queue_line],
                         "tasks queues update mapper --location=us-central1 " + " ".join(flags): {"json": {}}})
    assert preflight.ensure_queue(parsed, existing).startswith("gcloud tasks queues update mapper")
    create = "tasks queues create mapper --location=us-central1 " + " ".join(flags)
    new = Recorded({queue_line: {"error": "ERROR: (gcloud.tasks.queues.describe) NOT_FOUND: Requested entity was not "
                                          "found."}, create: {"json": {}}})
    assert preflight.ensure_queue(parsed, new) == "gcloud " + create
    assert (preflight.queue_flags({**parsed["queues"][0], "rate": "600/m"})[0] == "--max-dispatches-per-second=10")


def test_make_deploy_never_uploads_queue_yaml_and_checks_the_project_before_any_upload():
    steps = _make_deploy_steps()
    changes = [i for i, step in enumerate(steps) if step.startswith("gcloud app deploy")
               or step.endswith(("--secret-key", "--queue"))]
    checks = [steps.index("$(PY) -m devstack.preflight --enable-apis"), steps.index("$(PY) -m devstack.preflight")]
    assert checks == sorted(checks) and checks[1] < min(changes)
    assert not any("queue.yaml" in step for step in steps)


def test_the_valkey_ca_is_saved_from_gcloud_and_then_accepted(valkey_app_yaml, tmp_path):
    saved = tmp_path / "valkey-ca.pem"
    parsed = {**valkey_app_yaml, "env": {**valkey_app_yaml["env"], "CACHE_CA_FILE": str(saved)}}
    assert len(preflight.Preflight(parsed, Recorded(READY)).check()) == 1  # no such file yet: refused
    preflight.save_valkey_ca(parsed, Recorded(READY))
    assert preflight.Preflight(parsed, Recorded(READY)).check() == []
    assert Settings.from_env({"REDIS_URL": "rediss://10.128.0.5:6379/0", "CACHE_CA_FILE": str(saved),
                              "SECRET_KEY": "s" * 32}).cache_ca == saved.read_text()


@pytest.mark.parametrize("state", ["a Valkey instance on the shared regional CA",
                                   "a Valkey instance on a customer-managed CA"])
def test_the_valkey_ca_is_read_where_the_instance_keeps_it(valkey_app_yaml, tmp_path, state):
    saved = tmp_path / "valkey-ca.pem"
    parsed = {**valkey_app_yaml, "env": {**valkey_app_yaml["env"], "CACHE_CA_FILE": str(saved)}}
    answers = READY | BROKEN[state]
    preflight.save_valkey_ca(parsed, Recorded(answers))
    assert preflight.Preflight(parsed, Recorded(answers)).check() == []
    assert _der_of(saved) != _der_of(FIXTURES / "valkey-ca.pem")  # not the per-instance CA ready.json answers


def _der_of(path):
    return preflight._der_certificates(path.read_text())


def test_cron_yaml_is_checked_and_deployed_when_there_is_one(tmp_path, app):
    cron = "cron:\n- description: sweep\n  url: /api/tasks/sweep\n  schedule: every 15 minutes\n"
    parsed, warnings = deployfiles.parse(_deploy_folder(tmp_path, **{"cron.yaml": cron}))
    assert warnings == "" and parsed["cron"] == [{"url": "/api/tasks/sweep", "schedule": "every 15 minutes",
                                                  "target": None}]
    assert unreachable(app, parsed["handlers"]) == [] and _handler_for("/api/tasks/sweep", parsed["handlers"])["script"]
    (tmp_path / "cron.yaml").write_text(cron.replace("  url: /api/tasks/sweep\n", ""))
    with pytest.raises(DevstackError, match=r"gcloud's parser refused(.|\n)*Missing required value \[url\]"):
        deployfiles.parse(tmp_path)
    (tmp_path / "none").mkdir()
    assert deployfiles.parse(_deploy_folder(tmp_path / "none"))[0]["cron"] is None
    # make deploy uploads it with the app when there is one (gcloud app deploy app.yaml cron.yaml), and only then
    uploads = [step.split()[3:] for step in _make_deploy_steps() if step.startswith("gcloud app deploy app.yaml")]
    assert uploads == [["app.yaml", "$(wildcard", "cron.yaml)"]], uploads


def test_the_upload_must_carry_gunicorn_conf_and_the_ca_file(tmp_path):
    ca = "tests/fixtures/gcloud/valkey-ca.pem"  # in the repository, so that Settings reads it; but not uploaded
    folder = _deploy_folder(tmp_path, then={'REDIS_URL: "redis://10.0.0.3:6379/0"': 'REDIS_URL: "rediss://10.0.0.3"',
                                            'CACHE_CA_FILE: ""': f'CACHE_CA_FILE: "{ca}"'},
                            **{ca: ""})
    with pytest.raises(DevstackError, match="would not carry tests/fixtures/gcloud/valkey-ca.pem"):
        deployfiles.check_settings(deployfiles.parse(folder)[0])  # .gcloudignore leaves out tests/
    (folder / "gunicorn.conf.py").unlink()
    with pytest.raises(DevstackError, match="would not carry gunicorn.conf.py"):
        deployfiles.check_settings(deployfiles.parse(folder)[0])  # gunicorn.conf.py is checked first


# --- the cache's TLS: the instance's CA, named by CACHE_CA_FILE -------------------------------------------------------

@pytest.mark.parametrize("env, refusal", [
    ({"REDIS_URL": "rediss://10.0.0.3:6379/0"}, "REDIS_URL is rediss:// but CACHE_CA_FILE is not set"),
    ({"REDIS_URL": "redis://10.0.0.3:6379/0", "CACHE_CA_FILE": "ca.pem"}, "CACHE_CA_FILE is set but REDIS_URL is not"),
    ({"REDIS_URL": "rediss://10.0.0.3:6379/0", "CACHE_CA_FILE": "no-such-ca.pem"}, "is not a readable PEM file"),
    ({"REDIS_URL": "rediss://10.0.0.3:6379/0", "CACHE_CA_FILE": "app.yaml"}, "is not a readable PEM file"),
    ({"REDIS_URL": "rediss://10.0.0.3:6379/0", "CACHE_CA_FILE": "gunicorn.conf.py"}, "is not a readable PEM file"),
])
def test_the_app_refuses_to_start_with_tls_but_no_ca(env, refusal):
    with pytest.raises(RuntimeError, match=refusal):
        Settings.from_env({"SECRET_KEY": "s" * 32, **env})
    assert Settings.from_env({"SECRET_KEY": "s" * 32, "REDIS_URL": "redis://10.0.0.3:6379/0"}).cache_ca is None


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def tls_redis(tmp_path):
    """Debian's redis-server on a TLS port only, its certificate signed by a CA made here (as Memorystore for Valkey
    signs with the instance's own CA); `other.pem` a CA that signed nothing of it."""
    from devstack.services import Redis, _port_open

    for name in ("ca", "other"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                 "-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.pem"),
                 "-subj", f"/CN={name}")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             str(tmp_path / "server.key"), "-out", str(tmp_path / "server.csr"), "-subj", "/CN=valkey")
    _openssl("x509", "-req", "-in", str(tmp_path / "server.csr"), "-CA", str(tmp_path / "ca.pem"), "-CAkey",
             str(tmp_path / "ca.key"), "-CAcreateserial", "-days", "2", "-out", str(tmp_path / "server.pem"))

    class TlsRedis(Redis):
        def _args(self):
            args = super()._args()
            args[args.index("--port") + 1] = "0"
            return [*args, "--tls-port", str(self.port), "--tls-cert-file", str(tmp_path / "server.pem"),
                    "--tls-key-file", str(tmp_path / "server.key"), "--tls-auth-clients", "no"]

        def _answers(self):
            return _port_open(self.port)

    server = TlsRedis().start()
    yield server, tmp_path
    server.stop()


def test_the_cache_speaks_tls_trusting_only_the_named_ca(tls_redis, monkeypatch):
    server, folder = tls_redis
    # the server's CA in the system's trust store (as a public CA is): still refused when CACHE_CA_FILE names another
    monkeypatch.setenv("SSL_CERT_FILE", str(folder / "ca.pem"))
    url = f"rediss://{server.host}/0"
    client = make_client(Settings.from_env({"SECRET_KEY": "s" * 32, "REDIS_URL": url,
                                            "CACHE_CA_FILE": str(folder / "ca.pem")}))
    assert client.add("k", b"v", expire=60) and client.get("k") == b"v"
    strange = make_client(Settings.from_env({"SECRET_KEY": "s" * 32, "REDIS_URL": url,
                                             "CACHE_CA_FILE": str(folder / "other.pem")}))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        strange.get("k")
    plain = make_client(Settings.from_env({"SECRET_KEY": "s" * 32, "REDIS_URL": f"redis://{server.host}/0"}))
    with pytest.raises(redis.RedisError):
        plain.get("k")
    for each in (client, strange, plain):
        each.close()


# --- warm workers -----------------------------------------------------------------------------------------------------

def test_each_gunicorn_worker_warms_itself_before_any_request(stack, tmp_path):
    """Two workers, as app.yaml's entrypoint starts them, and no request at all (no /_ah/warmup either): each worker
    has made its Datastore lookup and its cache call on its own (gunicorn.conf.py)."""
    from devstack.serving import Gunicorn, app_env, wait_until

    log = tmp_path / "gunicorn.log"
    with log.open("w") as output:
        server = Gunicorn(app_env(stack, "s" * 32), access_log=True, wait=False, output=output)
        try:
            warm = wait_until(lambda: len(re.findall(r"worker (\d+) warm: Datastore ok, cache ok in \d+ ms",
                                                     log.read_text())) == 2 and log.read_text(),
                              "two workers warm", timeout=60)
            pids = set(re.findall(r"worker (\d+) warm", warm))
            assert len(pids) == 2 and "GET /" not in warm  # two processes, each warm before any request was sent
        finally:
            server.stop()
