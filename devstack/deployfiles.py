"""The deploy files read as `gcloud app deploy` reads them: app.yaml, index.yaml, queue.yaml and, when there is one,
cron.yaml parsed and validated by the Google Cloud CLI's own code (googlecloudsdk.api_lib.app.yaml_parsing, run on
the CLI's bundled Python), and what they say handed back as JSON. `make deploy` runs it first; tests/test_deploy.py
holds the app's routes to the handlers it returns. queue.yaml is never uploaded: it describes the queue, which
`make deploy` creates or updates through the Cloud Tasks API (devstack/preflight.py), and devstack's local Cloud
Tasks delivers by it.
"""
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from core.settings import Settings, secret_version
from devstack.services import REPO, DevstackError, sdk_roots

DEPLOYED = ("app.yaml", "index.yaml", "queue.yaml")
OPTIONAL = ("cron.yaml",)  # deployed when present: gcloud app deploy app.yaml cron.yaml

# Runs on the CLI's Python, with its lib/ on the path: what gcloud app deploy does with each file before uploading.
_PARSE = r"""
import json, os, sys
from googlecloudsdk.api_lib.app import yaml_parsing
from googlecloudsdk.command_lib.app import source_files_util
app_yaml, index_yaml, queue_yaml, cron_yaml, source = sys.argv[1:6]
info = yaml_parsing.ServiceYamlInfo.FromFile(app_yaml)
app = info.parsed
index = yaml_parsing.ConfigYamlInfo.FromFile(index_yaml).parsed
queue = yaml_parsing.ConfigYamlInfo.FromFile(queue_yaml).parsed
cron = yaml_parsing.ConfigYamlInfo.FromFile(cron_yaml).parsed if os.path.exists(cron_yaml) else None
env = app.env_variables or {}
# The files gcloud app deploy would upload from the source folder: its own choice (.gcloudignore), as in deploy_util.
# Without a .gcloudignore gcloud would write one into the folder: nothing is listed then, and the check refuses.
upload = None
if os.path.exists(os.path.join(source, ".gcloudignore")):
    upload = sorted(source_files_util.GetSourceFiles(source, app.skip_files.regex, info.HasExplicitSkipFiles(),
                                                     info.runtime, info.env, source))
print(json.dumps({
    "runtime": app.runtime, "entrypoint": app.entrypoint, "env_variables": sorted(env.keys()),
    "env": {name: value for name, value in env.items() if name != "SECRET_KEY"},
    "vpc_access_connector": app.vpc_access_connector and app.vpc_access_connector.name,
    "inbound_services": list(app.inbound_services or []),
    "max_concurrent_requests": int(app.automatic_scaling and app.automatic_scaling.max_concurrent_requests or 0),
    "handlers": [{"url": h.url, "script": h.script, "static_dir": h.static_dir, "secure": h.secure}
                 for h in app.handlers],
    "automatic_scaling": bool(app.automatic_scaling and app.automatic_scaling.max_instances),
    "indexes": [{"kind": i.kind, "ancestor": bool(i.ancestor),
                 "properties": [(p.name, p.direction or "asc") for p in i.properties or []]} for i in index.indexes],
    "queues": [{"name": q.name, "rate": q.rate, "bucket_size": q.bucket_size,
                "max_concurrent_requests": q.max_concurrent_requests,
                "retry": {name: getattr(q.retry_parameters, name, None) for name in (
                    "task_retry_limit", "min_backoff_seconds", "max_backoff_seconds", "max_doublings",
                    "task_age_limit")}} for q in queue.queue],
    "cron": cron and [{"url": c.url, "schedule": c.schedule, "target": c.target} for c in cron.cron or []],
    "upload": upload,
}))
"""


def sdk_python():
    """The CLI's own Python and its lib/ path: (python, PYTHONPATH)."""
    for root in sdk_roots():
        lib = root / "lib"
        if (lib / "googlecloudsdk" / "api_lib" / "app" / "yaml_parsing.py").exists():
            bundled = root / "platform" / "bundledpythonunix" / "bin" / "python3"
            return str(bundled if bundled.exists() else sys.executable), f"{lib}:{lib / 'third_party'}"
    raise DevstackError("The Google Cloud CLI was not found: install it (apt-get install google-cloud-cli) to check "
                        "the deploy files as gcloud does.")


def parse(folder=REPO):
    """What gcloud makes of `folder`'s deploy files: (the parsed files as a dict, gcloud's warnings)."""
    python, path = sdk_python()
    with tempfile.TemporaryDirectory(prefix="deployfiles-") as tmp:
        for name in DEPLOYED + OPTIONAL:
            if name in DEPLOYED or (Path(folder) / name).exists():
                (Path(tmp) / name).write_text((Path(folder) / name).read_text())
        # The user's gcloud configuration (HOME, CLOUDSDK_CONFIG) as the deploy reads it: gcloudignore/enabled among it.
        env = {"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}
        env |= {name: os.environ[name] for name in ("HOME", "CLOUDSDK_CONFIG") if name in os.environ}
        done = subprocess.run([python, "-c", _PARSE, *(str(Path(tmp) / n) for n in DEPLOYED + OPTIONAL),
                               str(folder)],
                              capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        raise DevstackError(f"gcloud's parser refused the deploy files:\n{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout), done.stderr.strip()


# App Engine's limit on the files of one version (the deployment quotas,
# https://cloud.google.com/appengine/docs/standard/quotas#Deployments); the deploy itself is refused past it.
MAX_UPLOAD_FILES = 10_000


def check_settings(parsed):
    """What would break on App Engine, said before the upload, one sentence each: what the app would refuse to start
    with (Settings.from_env, given app.yaml's variables), and what would start but not work."""
    env = parsed["env"]
    try:
        # the secret's name only: its value is read at an instance's start
        secret = secret_version(env | {"GOOGLE_CLOUD_PROJECT": "PROJECT"})
        Settings.from_env(env | {"GAE_ENV": "standard", "SECRET_KEY": "stand-in: Secret Manager is not read here"})
    except RuntimeError as e:
        raise DevstackError(f"app.yaml: {e}") from None
    if "SECRET_KEY" in parsed["env_variables"]:
        raise DevstackError("app.yaml: remove SECRET_KEY from env_variables, where anyone who may view the version's "
                            "configuration reads it; the key lives in Secret Manager (SECRET_KEY_SECRET).")
    if secret is None:
        raise DevstackError("app.yaml: set SECRET_KEY_SECRET to the Secret Manager secret holding the session key "
                            "(app-secret-key, which make deploy creates): without it the app will not start.")
    cache = [name for name in ("REDIS_URL", "MEMCACHED_HOSTS") if env.get(name, "").strip()]
    if cache and not parsed["vpc_access_connector"]:
        raise DevstackError(f"app.yaml: {cache[0]} is set but there is no vpc_access_connector: App Engine reaches a "
                            "Memorystore private IP only through a Serverless VPC Access connector, and without one "
                            "every cache call waits out its timeout.")
    upload = parsed["upload"]
    if upload is None:
        raise DevstackError("There is no .gcloudignore beside app.yaml: restore it, or the upload would carry "
                            "secret.yaml, the virtualenvs and the tests.")
    # What the app reads from its own folder at start: gunicorn's settings (each worker warms itself), the cache's CA.
    for needed in ("gunicorn.conf.py", env.get("CACHE_CA_FILE", "").strip()):
        if needed and needed not in upload:
            raise DevstackError(f"The upload would not carry {needed}, which the app reads at start: put it beside "
                                "app.yaml and keep it out of .gcloudignore.")
    if "secret.yaml" in upload:
        raise DevstackError("The upload would include secret.yaml, where an earlier version of this app kept its key: "
                            "delete it, or list it in .gcloudignore.")
    if len(upload) > MAX_UPLOAD_FILES:
        folders = sorted({name.split("/")[0] for name in upload if "/" in name},
                         key=lambda top: -sum(name.startswith(top + "/") for name in upload))
        raise DevstackError(f"The upload would be {len(upload)} files, over App Engine's {MAX_UPLOAD_FILES:,} a "
                            "version: list what need not be uploaded in .gcloudignore (the largest folders: "
                            f"{', '.join(folders[:3]) or 'none, the files are at the top'}).")


def _gcloud(*args, stdin=None):
    """A gcloud command's output; its error, said, stops the deploy."""
    done = subprocess.run(["gcloud", *args], input=stdin, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise DevstackError(f"gcloud {' '.join(args)} failed:\n{done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def indexes_not_ready(listed):
    """Of `gcloud datastore indexes list --format=json`, the indexes not yet READY: ["Kind (STATE)"]. An index's
    state is CREATING, READY, DELETING or ERROR (https://cloud.google.com/datastore/docs/reference/admin/rest/v1/
    projects.indexes#State)."""
    return [f"{index.get('kind')} ({index.get('state')})" for index in listed if index.get("state") != "READY"]


def wait_for_indexes(timeout=1800, every=20):
    """Return once every composite index of the project is READY. `make deploy` uploads index.yaml first and waits
    here before the app: on a fresh project a query whose index is still building fails (the app answers it with a
    503 and Retry-After, core/web.py), and a large index takes minutes to build."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = indexes_not_ready(json.loads(_gcloud("datastore", "indexes", "list", "--format=json") or "[]"))
        if not waiting:
            print("every index is READY")
            return
        if any("(ERROR)" in index for index in waiting):
            raise DevstackError(f"An index failed to build: {', '.join(waiting)}. `gcloud datastore indexes list` "
                                "says which; delete it (gcloud datastore indexes cleanup) and deploy again.")
        if time.monotonic() > deadline:
            raise DevstackError(f"Indexes still building after {timeout // 60} minutes: {', '.join(waiting)}. "
                                "Run make deploy again once `gcloud datastore indexes list` shows them READY.")
        print(f"waiting for {len(waiting)} indexes to be READY: {', '.join(waiting)}", flush=True)
        time.sleep(every)


def ensure_secret_key():
    """The session key's secret (app.yaml's SECRET_KEY_SECRET) exists, made of 32 random bytes the first time, and the
    app's service account may read it. Idempotent: an existing key is never replaced, since
    replacing it signs everyone out."""
    name = parse()[0]["env"]["SECRET_KEY_SECRET"].strip()
    if "/" in name:
        print(f"SECRET_KEY_SECRET names {name}: create it and grant the app's service account "
              "roles/secretmanager.secretAccessor on it yourself.")
        return
    project = _gcloud("config", "get-value", "project")
    _gcloud("services", "enable", "secretmanager.googleapis.com")
    if not _gcloud("secrets", "list", f"--filter=name~/secrets/{name}$", "--format=value(name)"):
        # A deployment made before the key moved to Secret Manager kept it in secret.yaml: the same key keeps its
        # sessions and its comment pseudonyms (core/people.pseudonym).
        old = REPO / "secret.yaml"
        key = None
        if old.exists():
            key = (yaml.safe_load(old.read_text()) or {}).get("env_variables", {}).get("SECRET_KEY")
        _gcloud("secrets", "create", name, "--replication-policy=automatic", "--data-file=-",
                stdin=key or secrets.token_hex(32))
        print(f"created the secret {name} with {'the key of secret.yaml' if key else 'a new session key'}")
    # The account the app runs as (`gcloud app describe`'s serviceAccount), App Engine's default one unless changed.
    account = _gcloud("app", "describe", "--format=value(serviceAccount)") or f"{project}@appspot.gserviceaccount.com"
    _gcloud("secrets", "add-iam-policy-binding", name, f"--member=serviceAccount:{account}",
            "--role=roles/secretmanager.secretAccessor")
    print(f"{account} may read the secret {name}")


def check():
    """The deploy files as gcloud reads them, and everything check_settings refuses."""
    parsed, warnings = parse()
    check_settings(parsed)
    if warnings:
        raise DevstackError(f"gcloud warns about the deploy files:\n{warnings}")
    cron = parsed["cron"]
    print(f"deploy files parsed as gcloud does: {parsed['runtime']}, {len(parsed['handlers'])} handlers, "
          f"{len(parsed['indexes'])} indexes, queues {', '.join(q['name'] for q in parsed['queues'])} (made through "
          f"the Cloud Tasks API, not uploaded), {f'{len(cron)} cron jobs' if cron is not None else 'no cron.yaml'}")


# `make deploy`'s steps, in its order: python -m devstack.deployfiles [--secret-key | --wait-for-indexes]
STEPS = {"": check, "--secret-key": ensure_secret_key, "--wait-for-indexes": wait_for_indexes}

if __name__ == "__main__":
    step = STEPS.get(" ".join(sys.argv[1:]))
    if step is None:
        sys.exit(f"usage: python -m devstack.deployfiles [{' | '.join(filter(None, STEPS))}]")
    try:
        step()
    except DevstackError as e:
        sys.exit(str(e))
