"""`make deploy`'s preflight: the project as it is, read through gcloud's JSON answers before anything is uploaded,
and each thing that would make the deployed app fail refused with the command that fixes it.

    python -m devstack.preflight                  the checks (read only)
    python -m devstack.preflight --enable-apis    enable the APIs the deploy and the app use
    python -m devstack.preflight --queue          create or update TASKS_QUEUE from queue.yaml, through the Cloud
                                                  Tasks API (queue.yaml itself is never uploaded)
    python -m devstack.preflight --save-valkey-ca write the Valkey instance's CA into CACHE_CA_FILE

Every read goes through `run(args) -> the JSON gcloud printed`, so tests/test_deploy.py feeds it gcloud's answers
recorded in tests/fixtures/gcloud/ and sees each refusal. The JSON fields read here are those of the resources' REST
references, which gcloud prints as they are (the field lists are also in the CLI's generated clients,
lib/googlecloudsdk/generated_clients/apis/<api>/<version>/*_messages.py).
"""
import ipaddress
import json
import ssl
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from core.settings import APP_ROOT, tasks_region
from devstack import deployfiles
from devstack.services import DevstackError


class GcloudFailed(Exception):
    """A gcloud command exited non-zero; its error output is the message."""


Runner = Callable[[list[str]], object]


def gcloud(args: list[str]) -> object:
    """The real runner: `gcloud ARGS --format=json`, its JSON answer."""
    done = subprocess.run(["gcloud", *args, "--format=json"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise GcloudFailed(done.stderr.strip()[-2000:])
    return json.loads(done.stdout or "null")


def _not_found(error: GcloudFailed) -> bool:
    said = str(error).lower()
    return "not_found" in said or "not found" in said or "does not exist" in said or "does not contain" in said


# The APIs the deploy and the app call, with what calls them. `make deploy` enables them (--enable-apis), which
# needs Service Usage Admin (or Owner) on the project; the preflight refuses while one is off.
APIS = {
    "appengine.googleapis.com": "App Engine Admin API: gcloud app deploy, gcloud app describe",
    "cloudbuild.googleapis.com": "Cloud Build: gcloud app deploy builds the python313 app with it",
    "datastore.googleapis.com": "Cloud Datastore API: the app's every read and write, index.yaml's upload",
    "firestore.googleapis.com": "Cloud Firestore API: gcloud firestore databases describe, the TTL policy",
    "cloudtasks.googleapis.com": "Cloud Tasks API: the mapper's and the sweeps' tasks, the queue",
    "secretmanager.googleapis.com": "Secret Manager API: the session key",
}
CONNECTOR_APIS = {"vpcaccess.googleapis.com": "Serverless VPC Access API: the connector to the cache"}
# A Valkey instance's "before you begin" enables the Memorystore, Network Connectivity and Service Consumer Management
# APIs (https://cloud.google.com/memorystore/docs/valkey/create-instances); the preflight reads the network and its
# firewall rules through the Compute Engine API.
VALKEY_APIS = {"memorystore.googleapis.com": "Memorystore API: the Valkey instance and its CA",
               "networkconnectivity.googleapis.com": "Network Connectivity API: the instance's service connection "
                                                     "policy",
               "serviceconsumermanagement.googleapis.com": "Service Consumer Management API: a prerequisite of "
                                                           "creating a Valkey instance",
               "compute.googleapis.com": "Compute Engine API: the VPC network and its firewall rules"}
# App Engine cron runs on Cloud Scheduler: "To deploy or update schedules, your account requires one of the following
# Identity and Access Management roles: Owner, Editor, Cloud Scheduler Admin (roles/cloudscheduler.admin)"
# (https://cloud.google.com/appengine/docs/standard/scheduling-jobs-with-cron-yaml).
CRON_APIS = {"cloudscheduler.googleapis.com": "Cloud Scheduler API: the jobs cron.yaml deploys"}
CRON_DEPLOYER_ROLES = {"roles/owner", "roles/editor", "roles/cloudscheduler.admin"}

# What the app's service account must hold on the project, and the predefined roles that hold it
# (https://cloud.google.com/iam/docs/understanding-roles). Basic roles count: older projects gave the App Engine
# default service account Editor.
NEEDED_ROLES = {
    "roles/datastore.user": ("the app's Datastore reads and writes (datastore.entities.*)",
                             {"roles/datastore.user", "roles/datastore.owner", "roles/editor", "roles/owner"}),
    "roles/cloudtasks.enqueuer": ("creating a task (cloudtasks.tasks.create)",
                                  {"roles/cloudtasks.enqueuer", "roles/cloudtasks.admin", "roles/editor",
                                   "roles/owner"}),
    # AppEngineHttpRequest "requires appengine.applications.get Google IAM permission for the project" (Cloud Tasks
    # v2 reference; google-cloud-tasks' tasks_v2/types/target.py says the same); the enqueuer role lacks it.
    "roles/appengine.appViewer": ("an App Engine task's appengine.applications.get",
                                  {"roles/appengine.appViewer", "roles/appengine.appAdmin", "roles/viewer",
                                   "roles/editor", "roles/owner"}),
}
# The account Cloud Build runs the deploy's build as: "the legacy Cloud Build SA ... or the Compute SA"
# (Cloud Build API, DefaultServiceAccount); new projects get the latter, which may hold no role
# (https://cloud.google.com/build/docs/cloud-build-service-account-updates).
BUILDER_ROLES = {"roles/cloudbuild.builds.builder", "roles/editor", "roles/owner"}

# App Engine calls two regions' Firestore databases by their multi-regions
# (https://cloud.google.com/appengine/docs/standard/locations): an app there has its database in nam5 or eur3.
APP_ENGINE_DATABASE_LOCATIONS = {"us-central": "nam5", "europe-west": "eur3"}


@dataclass
class Preflight:
    """The checks on one project. `parsed`: app.yaml and queue.yaml as gcloud reads them (deployfiles.parse)."""
    parsed: dict
    run: Runner = gcloud

    def __post_init__(self) -> None:
        self.env = self.parsed["env"]
        self.problems: list[str] = []
        self.passed: list[str] = []

    def refuse(self, problem: str) -> None:
        self.problems.append(problem)

    def check(self) -> list[str]:
        """Every problem found, each with its fix; empty when the project is ready."""
        project = self.run(["config", "get-value", "project"])
        if not project:
            return ["No project is set: `gcloud config set project PROJECT_ID`."]
        self.project = str(project)
        if not self.apis_enabled():
            return self.problems  # nothing else can be read while its API is off
        app = self.app()
        if app is not None:
            self.database(app)
            self.connector_and_cache(app)
            self.queue()
            self.roles(app)
        return self.problems

    def needed_apis(self) -> dict[str, str]:
        apis = dict(APIS)
        if self.parsed["vpc_access_connector"]:
            apis |= CONNECTOR_APIS
        if self.env.get("REDIS_URL", "").strip():
            apis |= VALKEY_APIS
        if self.parsed.get("cron"):
            apis |= CRON_APIS
        return apis

    def apis_enabled(self) -> bool:
        listed = self.run(["services", "list", "--enabled"]) or []
        enabled = {(s.get("config") or {}).get("name") or s["name"].rsplit("/", 1)[-1] for s in listed}
        off = [name for name in self.needed_apis() if name not in enabled]
        if off:
            self.refuse(f"APIs not enabled: {', '.join(off)} ({'; '.join(self.needed_apis()[n] for n in off)}). "
                        f"`make deploy` enables them (python -m devstack.preflight --enable-apis), or: gcloud "
                        f"services enable {' '.join(off)}")
        return not off

    def app(self) -> dict | None:
        try:
            app = self.run(["app", "describe"])
        except GcloudFailed as e:
            if not _not_found(e):
                raise
            self.refuse("The project has no App Engine app: `gcloud app create --region=REGION` (the region cannot "
                        "be changed later; docs/deploy.md, section 1).")
            return None
        assert isinstance(app, dict)
        if app.get("servingStatus", "SERVING") != "SERVING":
            self.refuse(f"The App Engine app is {app['servingStatus']}: enable it again (Cloud Console, App Engine, "
                        "Settings, Enable application).")
        wanted = tasks_region(app["locationId"])
        if self.env.get("TASKS_LOCATION", "").strip() and tasks_region(self.env["TASKS_LOCATION"]) != wanted:
            self.refuse(f"TASKS_LOCATION is {self.env['TASKS_LOCATION']!r} but the app is in {app['locationId']}: "
                        f"set TASKS_LOCATION: \"{wanted}\" in app.yaml (its tasks go to the app of the queue's "
                        "project, from a queue in the app's region).")
        self.region = wanted
        return app

    def database(self, app: dict) -> None:
        location = APP_ENGINE_DATABASE_LOCATIONS.get(app["locationId"], self.region)
        create = f"gcloud firestore databases create --location={location} --type=datastore-mode"
        try:
            database = self.run(["firestore", "databases", "describe", "--database=(default)"])
        except GcloudFailed as e:
            if not _not_found(e):
                raise
            self.refuse(f"The project has no (default) database: `{create}`.")
            return
        assert isinstance(database, dict)
        if database.get("type") != "DATASTORE_MODE":
            self.refuse(f"The (default) database is {database.get('type')}, not DATASTORE_MODE: the app speaks the "
                        "Datastore API, which a Native mode database refuses. While it holds no data: `gcloud "
                        "firestore databases update --type=datastore-mode` "
                        "(https://cloud.google.com/datastore/docs/firestore-or-datastore).")
        if database.get("locationId") not in (location, self.region):
            self.refuse(f"The (default) database is in {database.get('locationId')}, the app in {app['locationId']}: "
                        "every Datastore call would cross regions. A database's location cannot be changed: while "
                        "it holds no data, `gcloud firestore databases delete --database='(default)'`, then "
                        f"`{create}`.")
        # Refused, not warned: databases in OPTIMISTIC_WITH_ENTITY_GROUPS "are still subject to the 25 entity group
        # transaction limit as well as the 1 write per second limit"
        # (https://cloud.google.com/datastore/docs/upgrade-to-firestore), and a mapper chunk is one transaction over a
        # page of root entities (100 by default, mapper/jobs.py), so every job would fail. The mode is the Admin API's
        # Database.concurrencyMode, "not recommended for any new databases"
        # (https://cloud.google.com/firestore/docs/reference/rest/v1/projects.databases#concurrencymode).
        if database.get("concurrencyMode") == "OPTIMISTIC_WITH_ENTITY_GROUPS":
            self.refuse("The (default) database's concurrencyMode is OPTIMISTIC_WITH_ENTITY_GROUPS: a transaction "
                        "may touch at most 25 entity groups there, and a mapper chunk touches a page of 100. Set it to "
                        "PESSIMISTIC, Firestore's default, through the Admin API: `curl -X PATCH -H \"Authorization: "
                        "Bearer $(gcloud auth print-access-token)\" -H 'Content-Type: application/json' -d "
                        "'{\"concurrencyMode\": \"PESSIMISTIC\"}' 'https://firestore.googleapis.com/v1/projects/"
                        f"{self.project}/databases/(default)?updateMask=concurrencyMode'` (docs/deploy.md, section 1).")

    def connector_and_cache(self, app: dict) -> None:
        name = self.parsed["vpc_access_connector"]
        if not name:
            return
        parts = name.split("/")
        if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" or parts[4] != "connectors":
            self.refuse(f"vpc_access_connector {name!r} is not projects/PROJECT_ID/locations/REGION/connectors/NAME.")
            return
        project, region, connector_name = parts[1], parts[3], parts[5]
        # App Engine uses a connector of its own region (https://cloud.google.com/appengine/docs/standard/connecting-vpc).
        if region != self.region:
            self.refuse(f"The connector is in {region}, the app in {app['locationId']}: App Engine uses a connector "
                        f"of its own region. Create one there: `gcloud compute networks vpc-access connectors create "
                        f"NAME --region={self.region} --network=NETWORK --range=10.8.0.0/28`, and name it in app.yaml.")
            return
        try:
            connector = self.run(["compute", "networks", "vpc-access", "connectors", "describe", connector_name,
                                  f"--region={region}", f"--project={project}"])
        except GcloudFailed as e:
            if not _not_found(e):
                raise
            self.refuse(f"There is no connector {name}: `gcloud compute networks vpc-access connectors create "
                        f"{connector_name} --region={region} --network=NETWORK --range=10.8.0.0/28`.")
            return
        assert isinstance(connector, dict)
        if connector.get("state") != "READY":
            self.refuse(f"The connector {connector_name} is {connector.get('state')}, not READY: wait for it, or "
                        "delete it and create it again (an ERROR connector does not mend).")
        url = self.env.get("REDIS_URL", "").strip()
        if url:
            network = str(connector.get("network", "")).rsplit("/", 1)[-1]
            if self.network_reaches_valkey(network, str(connector.get("ipCidrRange", ""))):
                self.valkey(url, region, network)

    def network_reaches_valkey(self, network: str, connector_range: str) -> bool:
        """The connector's VPC network exists, and a firewall rule lets the connector reach Valkey's ports. Valkey's
        connect page: "For all of your instance's Private Service Connect endpoints, you must allow TCP port 6379, as
        well as TCP ports 11000 through 13047" (https://cloud.google.com/memorystore/docs/valkey/connect-instance).
        The answers are Compute Engine's Network and Firewall resources
        (https://cloud.google.com/compute/docs/reference/rest/v1/networks,
        https://cloud.google.com/compute/docs/reference/rest/v1/firewalls)."""
        try:
            self.run(["compute", "networks", "describe", network])
        except GcloudFailed as e:
            if not _not_found(e):
                raise
            self.refuse(f"There is no VPC network {network!r}, the connector's: a new project may have no `default` "
                        f"network. `gcloud compute networks create {network} --subnet-mode=custom`, then a subnet in "
                        f"{self.region}: `gcloud compute networks subnets create {network}-{self.region} "
                        f"--network={network} --region={self.region} --range=10.0.0.0/24` (docs/deploy.md, section 5).")
            return False
        rules = [rule for rule in self.run(["compute", "firewall-rules", "list"]) or []
                 if str(rule.get("network", "")).rsplit("/", 1)[-1] == network]
        allowed = _tcp_ports_allowed(rules, connector_range)
        missing = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in VALKEY_PORTS if not _covered(allowed, lo, hi)]
        if missing:
            self.refuse(f"No enabled ingress firewall rule of the network {network!r} allows TCP {', '.join(missing)} "
                        f"from the connector's range {connector_range}: Valkey needs TCP 6379 and 11000-13047 open to "
                        f"its endpoints. `gcloud compute firewall-rules create allow-valkey --network={network} "
                        "--direction=INGRESS --action=ALLOW --rules=tcp:6379,tcp:11000-13047 "
                        f"--source-ranges={connector_range}`.")
        return True

    def valkey_instance(self, url: str, region: str) -> dict | None:
        """The Memorystore for Valkey instance one of whose endpoints REDIS_URL names, in `region`."""
        host = urlsplit(url).hostname
        for instance in self.run(["memorystore", "instances", "list", f"--location={region}"]) or []:
            if host in {endpoint.address for endpoint in _endpoints(instance)}:
                return instance
        return None

    def valkey(self, url: str, region: str, network: str) -> None:
        instance = self.valkey_instance(url, region)
        host = urlsplit(url).hostname
        if instance is None:
            self.refuse(f"REDIS_URL's address {host} is not the endpoint of a Memorystore for Valkey instance in "
                        f"{region} (`gcloud memorystore instances list --location={region}`): set it to the "
                        "instance's primary endpoint, or create the instance (docs/deploy.md, section 5).")
            return
        name = instance["name"].rsplit("/", 1)[-1]
        if instance.get("state") != "ACTIVE":
            self.refuse(f"The Valkey instance {name} is {instance.get('state')}, not ACTIVE: wait for it.")
        if instance.get("mode") == "CLUSTER":
            self.refuse(f"The Valkey instance {name} has Cluster Mode Enabled: the app's client speaks to one "
                        "server. Create an instance with --mode=cluster-disabled (the mode cannot be changed).")
        else:
            self.primary_endpoint(instance, url)
        networks = {endpoint.network.rsplit("/", 1)[-1] for endpoint in _endpoints(instance)
                    if endpoint.address == host}
        if network not in networks:
            self.refuse(f"The connector is in the network {network!r} but {name}'s endpoint {host} is in "
                        f"{', '.join(sorted(networks))}: a connector reaches addresses of its own network only. "
                        "Create the connector in the instance's network.")
        encrypted = instance.get("transitEncryptionMode") == "SERVER_AUTHENTICATION"
        if encrypted != url.startswith("rediss://"):
            self.refuse(f"The Valkey instance {name} has in-transit encryption "
                        f"{'on: REDIS_URL must be rediss://' if encrypted else 'off: REDIS_URL must be redis://'} "
                        "(and CACHE_CA_FILE set only with rediss://).")
        elif encrypted:
            self.valkey_ca(instance, region)

    def primary_endpoint(self, instance: dict, url: str) -> None:
        """REDIS_URL names the primary endpoint of a Cluster Mode Disabled instance. Such an instance has a primary
        endpoint, which sends everything to the primary node, and a reader endpoint, which spreads reads over the
        replicas; a discovery endpoint belongs to Cluster Mode Enabled
        (https://cloud.google.com/memorystore/docs/valkey/product-overview, "Instance endpoints"; the memorystore v1
        ConnectionType: CONNECTION_TYPE_PRIMARY "used as primary endpoint to access primary", _READER "used as
        reader endpoint to access replicas", _DISCOVERY "used for topology discovery")."""
        endpoints, named_url = _endpoints(instance), urlsplit(url)
        named = {endpoint.connection_type for endpoint in endpoints if endpoint.address == named_url.hostname}
        if "CONNECTION_TYPE_PRIMARY" in named:
            return
        primary = [f"{e.address}:{e.port}" for e in endpoints if e.connection_type == "CONNECTION_TYPE_PRIMARY"]
        fix = (f"set REDIS_URL to its primary endpoint, {named_url.scheme}://{primary[0]}/0" if primary else
               "the instance has no CONNECTION_TYPE_PRIMARY endpoint: create it as docs/deploy.md, section 5 says")
        kind = ("its reader endpoint (CONNECTION_TYPE_READER), which serves replicas, where the app's writes are "
                "refused" if "CONNECTION_TYPE_READER" in named else
                f"a {'/'.join(sorted(named))} endpoint, which belongs to Cluster Mode Enabled, on a Cluster Mode "
                "Disabled instance")
        self.refuse(f"REDIS_URL names {kind}: {fix}.")

    def instance_ca(self, instance: dict, region: str) -> list[str]:
        """The CA certificates, PEM, that sign the instance's server certificates, read where its serverCaMode keeps
        them (memorystore v1 Instance.ServerCaMode): its own Google-managed CA (GOOGLE_MANAGED_PER_INSTANCE_CA, and
        instances that predate the field), the region's shared one (GOOGLE_MANAGED_SHARED_CA,
        https://cloud.google.com/memorystore/docs/valkey/use-shared-ca), or the CAs of the customer's CA Service pool
        (CUSTOMER_MANAGED_CAS_CA, https://cloud.google.com/memorystore/docs/valkey/use-customer-managed-ca)."""
        mode = str(instance.get("serverCaMode", "")).removeprefix("SERVER_CA_MODE_")  # the deprecated aliases
        if mode == "CUSTOMER_MANAGED_CAS_CA":
            _, project, _, location, _, pool = str(instance["serverCaPool"]).split("/")
            where = [f"--pool={pool}", f"--location={location}", f"--project={project}"]
            # Certificate Authority Service's CertificateAuthority.pemCaCertificates: the CA's chain, root last.
            return [pem for kind in ("roots", "subordinates")
                    for authority in self.run(["privateca", kind, "list", *where]) or []
                    for pem in authority.get("pemCaCertificates", [])]
        if mode == "GOOGLE_MANAGED_SHARED_CA":
            answer = self.run(["memorystore", "instances", "get-shared-regional-certificate-authority",
                               f"--location={region}"])
        else:
            name = instance["name"].rsplit("/", 1)[-1]
            answer = self.run(["memorystore", "instances", "get-certificate-authority", name, f"--location={region}"])
        # CertificateAuthority and SharedRegionalCertificateAuthority both answer managedServerCa.caCerts[] of
        # certificate chains (memorystore v1 REST reference).
        assert isinstance(answer, dict)
        return [pem for chain in (answer.get("managedServerCa") or {}).get("caCerts", [])
                for pem in chain.get("certificates", [])]

    def valkey_ca(self, instance: dict, region: str) -> None:
        ca_file = self.env.get("CACHE_CA_FILE", "").strip()
        try:
            trusted = _der_certificates((APP_ROOT / ca_file).read_text()) if ca_file else set()
        except (OSError, ValueError):
            trusted = set()
        name = instance["name"].rsplit("/", 1)[-1]
        missing = [pem for pem in self.instance_ca(instance, region) if _der(pem) not in trusted]
        if missing:
            self.refuse(f"CACHE_CA_FILE {ca_file!r} does not hold {len(missing)} of the Valkey instance {name}'s CA "
                        f"certificates ({instance.get('serverCaMode', 'GOOGLE_MANAGED_PER_INSTANCE_CA')}), so every "
                        "TLS connection would be refused: `python -m devstack.preflight --save-valkey-ca` writes them "
                        "there.")

    def queue(self) -> None:
        queue, location = self.env.get("TASKS_QUEUE") or "mapper", self.region
        try:
            answer = self.run(["tasks", "queues", "describe", queue, f"--location={location}"])
        except GcloudFailed as e:
            if not _not_found(e):
                raise
            self.passed.append(f"queue {queue} does not exist yet: make deploy creates it")
            return
        assert isinstance(answer, dict)
        # PAUSED, or DISABLED: what an upload of a queue.yaml that does not name the queue leaves it
        # (Cloud Tasks v2, Queue.State).
        if answer.get("state") != "RUNNING":
            self.refuse(f"The queue {queue} is {answer.get('state')}: its tasks are not delivered. `gcloud tasks "
                        f"queues resume {queue} --location={location}`.")

    def roles(self, app: dict) -> None:
        policy = self.run(["projects", "get-iam-policy", self.project])
        assert isinstance(policy, dict)
        held: dict[str, set[str]] = {}
        for binding in policy.get("bindings", []):
            if binding.get("condition"):
                continue  # a conditional grant may not hold when the app calls
            for member in binding.get("members", []):
                held.setdefault(member, set()).add(binding["role"])
        account = app.get("serviceAccount") or f"{self.project}@appspot.gserviceaccount.com"
        has = held.get(f"serviceAccount:{account}", set())
        for role, (why, covering) in NEEDED_ROLES.items():
            if not has & covering:
                self.refuse(f"The app's service account {account} lacks {role} ({why}): `gcloud projects "
                            f"add-iam-policy-binding {self.project} --member=serviceAccount:{account} --role={role}`. "
                            "The preflight reads the project's own policy: a grant through a group or a folder is "
                            "not seen, so grant it on the project.")
        if self.parsed.get("cron"):
            self.cron_deployer(held)
        builder = self.run(["builds", "get-default-service-account"])
        assert isinstance(builder, dict)
        email = str(builder.get("serviceAccountEmail") or "").rsplit("/", 1)[-1]
        if not email:
            self.refuse("Cloud Build has no default service account in this project: builds need one (docs/"
                        "deploy.md, section 2).")
        elif not held.get(f"serviceAccount:{email}", set()) & BUILDER_ROLES:
            self.refuse(f"Cloud Build runs the deploy's build as {email}, which lacks roles/cloudbuild.builds.builder"
                        f": `gcloud projects add-iam-policy-binding {self.project} --member=serviceAccount:{email} "
                        "--role=roles/cloudbuild.builds.builder`.")

    def cron_deployer(self, held: dict[str, set[str]]) -> None:
        """`make deploy` uploads cron.yaml as the account gcloud runs as, which needs Owner, Editor or Cloud
        Scheduler Admin (CRON_DEPLOYER_ROLES' source)."""
        account = str(self.run(["config", "get-value", "account"]) or "")
        member = f"{'serviceAccount' if account.endswith('.gserviceaccount.com') else 'user'}:{account}"
        if not held.get(member, set()) & CRON_DEPLOYER_ROLES:
            self.refuse(f"You deploy as {account or 'no account'}, which holds none of Owner, Editor and Cloud "
                        "Scheduler Admin on the project: deploying cron.yaml needs one. `gcloud projects "
                        f"add-iam-policy-binding {self.project} --member={member} --role=roles/cloudscheduler.admin`.")


class Endpoint(NamedTuple):
    address: str
    port: int
    network: str
    connection_type: str


def _endpoints(instance: dict) -> list[Endpoint]:
    """Every endpoint of a Valkey instance (memorystore v1 Instance): its PSC connections' (pscAutoConnection or
    pscConnection: ipAddress, port, network, connectionType), and the deprecated discoveryEndpoints, which are
    discovery endpoints."""
    found = [Endpoint(e.get("address", ""), e.get("port", 6379), e.get("network", ""), "CONNECTION_TYPE_DISCOVERY")
             for e in instance.get("discoveryEndpoints", [])]
    for group in instance.get("endpoints", []):
        for connection in group.get("connections", []):
            psc = connection.get("pscAutoConnection") or connection.get("pscConnection") or {}
            found.append(Endpoint(psc.get("ipAddress", ""), psc.get("port", 6379), psc.get("network", ""),
                                  psc.get("connectionType", "CONNECTION_TYPE_UNSPECIFIED")))
    return [endpoint for endpoint in found if endpoint.address]


# The TCP ports Valkey's endpoints must be reachable on (connect-instance, quoted in network_reaches_valkey).
VALKEY_PORTS = ((6379, 6379), (11000, 13047))


def _tcp_ports_allowed(rules: list[dict], source: str) -> list[tuple[int, int]]:
    """The TCP port ranges that the enabled INGRESS ALLOW rules among `rules` open to every address of `source` (a
    CIDR range), on every target (no targetTags or targetServiceAccounts). Compute Engine's Firewall: `allowed[]`
    of {IPProtocol, ports}, where no ports means all of them. Deny rules are not weighed."""
    ranges: list[tuple[int, int]] = []
    for rule in rules:
        if (rule.get("direction", "INGRESS") != "INGRESS" or rule.get("disabled") or rule.get("targetTags")
                or rule.get("targetServiceAccounts")
                or not any(_within(source, allowed) for allowed in rule.get("sourceRanges", []))):
            continue
        for allowed in rule.get("allowed", []):
            if allowed.get("IPProtocol") in ("tcp", "all", "6"):
                for ports in allowed.get("ports") or ["0-65535"]:
                    lo, _, hi = ports.partition("-")
                    ranges.append((int(lo), int(hi or lo)))
    return ranges


def _within(inner: str, outer: str) -> bool:
    try:
        small, large = ipaddress.ip_network(inner, strict=False), ipaddress.ip_network(outer, strict=False)
    except ValueError:
        return False
    return small.network_address in large and small.broadcast_address in large


def _covered(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether the union of `ranges` holds every port from lo to hi."""
    for start, end in sorted(ranges):
        if start <= lo <= end:
            lo = end + 1
        if lo > hi:
            return True
    return False


def _der(pem: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.strip() + "\n")


def _der_certificates(text: str) -> set[bytes]:
    end = "-----END CERTIFICATE-----"
    return {_der(block + end) for block in text.split(end) if "-----BEGIN CERTIFICATE-----" in block}


def enable_apis(parsed: dict, run: Runner = gcloud) -> None:
    apis = Preflight(parsed, run).needed_apis()
    run(["services", "enable", *apis])
    print(f"enabled: {', '.join(apis)}")


# queue.yaml's rate units (https://cloud.google.com/appengine/docs/standard/python/config/queueref#rate)
RATE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def queue_flags(queue: dict) -> list[str]:
    """queue.yaml's queue as `gcloud tasks queues create/update` flags. Each Cloud Tasks field "has the same meaning
    as" its queue.yaml setting (Cloud Tasks v2, RateLimits and RetryConfig): rate is max_dispatches_per_second,
    max_concurrent_requests max_concurrent_dispatches, task_retry_limit max_attempts. bucket_size has no flag: for a
    queue made through the API, Cloud Tasks sets max_burst_size itself, "generally at least equal to
    max_dispatches_per_second"."""
    number, unit = queue["rate"].split("/")
    flags = [f"--max-dispatches-per-second={float(number) / RATE_UNITS[unit]:g}",
             f"--max-concurrent-dispatches={queue['max_concurrent_requests']}"]
    retry = queue["retry"]
    names = {"task_retry_limit": "max-attempts", "min_backoff_seconds": "min-backoff",
             "max_backoff_seconds": "max-backoff", "max_doublings": "max-doublings",
         }
    if retry.get("task_age_limit") is not None:
        raise DevstackError("queue.yaml's task_age_limit has no translation here: set max_retry_duration with "
                            "`gcloud tasks queues update` yourself, or leave it out.")
    for field, flag in names.items():
        value = retry.get(field)
        if value is not None:
            seconds = field.endswith("_seconds")
            flags.append(f"--{flag}={value:g}s" if seconds else f"--{flag}={value}")
    return flags


def ensure_queue(parsed: dict, run: Runner = gcloud) -> str:
    """TASKS_QUEUE created, or updated, as queue.yaml describes it, in TASKS_LOCATION: the Cloud Tasks API, which
    Google asks new users to manage queues with; an upload of queue.yaml would pause every queue it does not name
    (https://cloud.google.com/tasks/docs/queue-yaml). The gcloud command it ran."""
    env = parsed["env"]
    name, location = env.get("TASKS_QUEUE") or "mapper", tasks_region(env["TASKS_LOCATION"])
    queue = next((q for q in parsed["queues"] if q["name"] == name), None)
    if queue is None:
        raise DevstackError(f"queue.yaml does not describe TASKS_QUEUE {name!r}: add it there.")
    try:
        run(["tasks", "queues", "describe", name, f"--location={location}"])
        verb = "update"
    except GcloudFailed as e:
        if not _not_found(e):
            raise
        verb = "create"
    args = ["tasks", "queues", verb, name, f"--location={location}", *queue_flags(queue)]
    run(args)
    return "gcloud " + " ".join(args)


def save_valkey_ca(parsed: dict, run: Runner = gcloud) -> None:
    """Write the instance's CA certificates into CACHE_CA_FILE (docs/deploy.md, section 5)."""
    env = parsed["env"]
    check = Preflight(parsed, run)
    check.region = tasks_region(env.get("TASKS_LOCATION", ""))
    if not env.get("CACHE_CA_FILE", "").strip() or not env.get("REDIS_URL", "").startswith("rediss://"):
        raise DevstackError("Set REDIS_URL to rediss://ENDPOINT:6379/0 and CACHE_CA_FILE to a file name first.")
    instance = check.valkey_instance(env["REDIS_URL"], check.region)
    if instance is None:
        raise DevstackError(f"No Valkey instance in {check.region} has the endpoint of REDIS_URL.")
    name = instance["name"].rsplit("/", 1)[-1]
    pems = check.instance_ca(instance, check.region)
    (APP_ROOT / env["CACHE_CA_FILE"].strip()).write_text("".join(pem.strip() + "\n" for pem in pems))
    print(f"saved {len(pems)} CA certificates of {name} in {env['CACHE_CA_FILE']}")


def preflight(parsed: dict, run: Runner = gcloud) -> None:
    check = Preflight(parsed, run)
    try:
        problems = check.check()
    except GcloudFailed as e:
        raise DevstackError(f"gcloud could not read the project:\n{e}") from None
    if problems:
        raise DevstackError("Not deploying: the project is not ready.\n" + "\n".join(f"- {p}" for p in problems))
    print(f"preflight: {check.project} is ready" + "".join(f"; {said}" for said in check.passed))


STEPS = {"": preflight, "--enable-apis": enable_apis, "--queue": lambda parsed: print(ensure_queue(parsed)),
         "--save-valkey-ca": save_valkey_ca}

if __name__ == "__main__":
    step = STEPS.get(" ".join(sys.argv[1:]))
    if step is None:
        sys.exit(f"usage: python -m devstack.preflight [{' | '.join(filter(None, STEPS))}]")
    try:
        step(deployfiles.parse()[0])
    except (DevstackError, GcloudFailed) as e:
        sys.exit(str(e))
