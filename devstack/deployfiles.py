"""The deploy files read as `gcloud app deploy` reads them: app.yaml (with the secret.yaml it includes), index.yaml and
queue.yaml parsed and validated by the Google Cloud CLI's own code (googlecloudsdk.api_lib.app.yaml_parsing, run on
the CLI's bundled Python), and what they say handed back as JSON. `make deploy` runs it first; tests/test_deploy.py
holds the app's routes to the handlers it returns.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from core.settings import hosts
from devstack.services import REPO, DevstackError, sdk_roots

DEPLOYED = ("app.yaml", "index.yaml", "queue.yaml")

# Runs on the CLI's Python, with its lib/ on the path: what gcloud app deploy does with each file before uploading.
_PARSE = r"""
import json, sys
from googlecloudsdk.api_lib.app import yaml_parsing
app_yaml, index_yaml, queue_yaml = sys.argv[1:4]
app = yaml_parsing.ServiceYamlInfo.FromFile(app_yaml).parsed
index = yaml_parsing.ConfigYamlInfo.FromFile(index_yaml).parsed
queue = yaml_parsing.ConfigYamlInfo.FromFile(queue_yaml).parsed
print(json.dumps({
    "runtime": app.runtime, "entrypoint": app.entrypoint, "env_variables": sorted((app.env_variables or {}).keys()),
    "trusted_hosts": (app.env_variables or {}).get("TRUSTED_HOSTS") or "",
    "handlers": [{"url": h.url, "script": h.script, "static_dir": h.static_dir, "secure": h.secure}
                 for h in app.handlers],
    "automatic_scaling": bool(app.automatic_scaling and app.automatic_scaling.max_instances),
    "indexes": [{"kind": i.kind, "ancestor": bool(i.ancestor),
                 "properties": [(p.name, p.direction or "asc") for p in i.properties or []]} for i in index.indexes],
    "queues": [{"name": q.name, "rate": q.rate, "retry_limit": q.retry_parameters and
                q.retry_parameters.task_retry_limit} for q in queue.queue],
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


def parse(folder=REPO, secret=None):
    """What gcloud makes of `folder`'s deploy files: (the parsed files as a dict, gcloud's warnings). app.yaml includes
    secret.yaml, which `make deploy` writes and git never holds: a stand-in of the same shape is used when absent."""
    python, path = sdk_python()
    with tempfile.TemporaryDirectory(prefix="deployfiles-") as tmp:
        for name in DEPLOYED:
            (Path(tmp) / name).write_text((Path(folder) / name).read_text())
        secret_file = Path(folder) / "secret.yaml"
        (Path(tmp) / "secret.yaml").write_text(
            secret or (secret_file.read_text() if secret_file.exists() else "env_variables:\n  SECRET_KEY: 'x'\n"))
        done = subprocess.run([python, "-c", _PARSE, *(str(Path(tmp) / n) for n in DEPLOYED)], capture_output=True,
                              text=True, timeout=120, env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise DevstackError(f"gcloud's parser refused the deploy files:\n{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout), done.stderr.strip()


def check_settings(parsed):
    """What the app would refuse to start with, said before the deploy rather than by every instance at its start."""
    try:
        hosts(parsed["trusted_hosts"], True, "PROJECT_ID")
    except RuntimeError as e:
        raise DevstackError(f"app.yaml: {e}") from None


if __name__ == "__main__":  # `make deploy` runs this first
    try:
        parsed, warnings = parse()
        check_settings(parsed)
    except DevstackError as e:
        sys.exit(str(e))
    if warnings:
        sys.exit(f"gcloud warns about the deploy files:\n{warnings}")
    print(f"deploy files parsed as gcloud does: {parsed['runtime']}, {len(parsed['handlers'])} handlers, "
          f"{len(parsed['indexes'])} indexes, queues {', '.join(q['name'] for q in parsed['queues'])}")
