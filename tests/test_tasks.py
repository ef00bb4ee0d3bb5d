"""core/tasks.py: the Cloud Tasks queue against a gRPC server speaking the Cloud Tasks API on loopback (the real
service is not reachable from here), and the task route's guard on App Engine."""
import concurrent.futures
import json

import grpc
import pytest
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from core import runtime, tasks
from core.settings import Settings
from devstack.apps import app_on
from tests.support import ON_APP_ENGINE, running


@pytest.fixture
def cloud_tasks():
    """A loopback server for google.cloud.tasks.v2.CloudTasks/CreateTask that keeps what it is sent and answers
    ALREADY_EXISTS for a task name it has seen, as Cloud Tasks does."""
    received = []

    def create_task(request_bytes, context):
        request = tasks_v2.CreateTaskRequest.deserialize(request_bytes)
        if any(r.task.name == request.task.name for r in received):
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "Requested entity already exists")
        received.append(request)
        return tasks_v2.Task.serialize(request.task)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "google.cloud.tasks.v2.CloudTasks", {"CreateTask": grpc.unary_unary_rpc_method_handler(create_task)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
    yield client, received
    channel.close()
    server.stop(0)


@pytest.fixture
def gae_app(stack, cloud_tasks):
    """The app as on App Engine, its tasks sent to the loopback Cloud Tasks server."""
    client, _ = cloud_tasks
    app = app_on(stack, task_queue=tasks.CloudTasksQueue("proj", "us-central1", "mapper", client=client),
                 **ON_APP_ENGINE)
    with running(app):
        yield app


def test_cloud_tasks_queue_sends_named_app_engine_tasks_once(cloud_tasks, gae_app):
    client, received = cloud_tasks
    queue = runtime.of(gae_app).tasks
    payload = {"seed": "abc", "start": 0, "stop": 3}
    queue.enqueue("accounts.seed", payload, "seed-abc-0")
    queue.enqueue("accounts.seed", payload, "seed-abc-0")  # ALREADY_EXISTS: success, not an error
    assert len(received) == 1
    request = received[0]
    assert request.parent == "projects/proj/locations/us-central1/queues/mapper"
    assert request.task.name == "projects/proj/locations/us-central1/queues/mapper/tasks/seed-abc-0"
    http = request.task.app_engine_http_request
    assert http.http_method == tasks_v2.HttpMethod.POST
    assert http.relative_uri == "/api/tasks/accounts.seed"
    assert http.headers["Content-Type"] == "application/json" and json.loads(http.body) == payload

    # what Cloud Tasks would then deliver: accepted with App Engine's queue header, refused without it
    client = gae_app.test_client()
    delivered = client.post(http.relative_uri, data=http.body, headers=dict(http.headers))
    assert delivered.status_code == 403
    delivered = client.post(http.relative_uri, data=http.body,
                            headers=dict(http.headers, **{tasks.QUEUE_HEADER: "mapper", tasks.RETRY_HEADER: "0"}))
    assert delivered.status_code == 200 and delivered.get_json() == {"created": 3}


def test_enqueue_refuses_unknown_handlers_and_bad_names(cloud_tasks, gae_app):
    client, received = cloud_tasks
    queue = runtime.of(gae_app).tasks
    with pytest.raises(ValueError):
        queue.enqueue("no.such.handler", {}, "t-1")
    with pytest.raises(ValueError):
        queue.enqueue("accounts.seed", {}, "bad/name")
    assert received == []


def test_cloud_tasks_needs_a_location_and_off_app_engine_a_local_server():
    with pytest.raises(RuntimeError, match="TASKS_LOCATION"):
        Settings.from_env({"GAE_ENV": "standard", "SECRET_KEY": "s" * 32})
    # App Engine's names for its two oldest regions (what `gcloud app describe` prints) are Cloud Tasks' us-central1
    # and europe-west1; anything else that is not a region's name stops the app at its start.
    deployed = {**ON_APP_ENGINE, "TASKS_LOCATION": ""}
    assert Settings.from_env(deployed | {"TASKS_LOCATION": "europe-west"}).tasks_location == "europe-west1"
    assert Settings.from_env(deployed | {"TASKS_LOCATION": "asia-northeast1"}).tasks_location == "asia-northeast1"
    with pytest.raises(RuntimeError, match="not a region's name"):
        Settings.from_env(deployed | {"TASKS_LOCATION": "Iowa"})
    local = Settings.from_env({"CLOUD_TASKS_EMULATOR_HOST": "127.0.0.1:9", "SECRET_KEY": "s" * 32})
    assert (local.tasks_emulator_host, local.tasks_location) == ("127.0.0.1:9", "local")
    assert isinstance(tasks.make_queue(local), tasks.CloudTasksQueue)
    # neither App Engine nor a local server: the app serves, and says what is missing when it tries to enqueue
    with pytest.raises(RuntimeError, match="CLOUD_TASKS_EMULATOR_HOST"):
        tasks.make_queue(Settings.from_env({"SECRET_KEY": "s" * 32})).enqueue("accounts.seed", {}, "t-1")
