"""Apache Beam's own batch pipeline over the accounts, for bench/mapper.py to time beside its baseline: what a team on
Google Cloud writes today (ReadFromDatastore, +1, WriteToDatastore; on Dataflow in production, here the
DirectRunner). Run by Beam's virtualenv, not the app's (`make bench-beam` makes it from bench/requirements-beam.txt):
it imports nothing of the app. It talks to the Datastore named by DATASTORE_EMULATOR_HOST, as Beam's client does:
the bare emulator, or under a latency profile devstack's stand-in in front of it (devstack/standin.py), the address
bench/mapper.py gives the app too, so that Beam waits production's round trips and takes its turns at each entity.

Beam's ramp-up throttle is off: on by default, it holds a new job to 500 writes a second shared by
`hint_num_workers` (500) workers for its first five minutes, Google's "500/50/5" advice for a cold production database
(https://cloud.google.com/datastore/docs/best-practices#ramping_up_traffic); the app's fan-out has no such throttle.

Prints one JSON line: {"seconds": the pipeline's run (after its imports), "cpu": this process's CPU in it,
"beam": Beam's version}.

Run: DATASTORE_EMULATOR_HOST=127.0.0.1:PORT <beam python> bench/beam_pipeline.py --project P [--namespace N]
     [--splits 12]
"""
import argparse
import json
import time

import apache_beam as beam
from apache_beam.io.gcp.datastore.v1new.datastoreio import ReadFromDatastore, WriteToDatastore
from apache_beam.io.gcp.datastore.v1new.types import Query
from apache_beam.options.pipeline_options import PipelineOptions


def credited(entity):
    entity.properties["balance"] += 1
    return entity


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--splits", type=int, default=12)
    args = parser.parse_args()
    query = Query(kind="Account", project=args.project, namespace=args.namespace)
    start, cpu = time.perf_counter(), time.process_time()
    with beam.Pipeline(options=PipelineOptions(runner="DirectRunner")) as pipeline:
        (pipeline
         | ReadFromDatastore(query, num_splits=args.splits)
         | beam.Map(credited)
         | WriteToDatastore(args.project, throttle_rampup=False))
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                      "beam": beam.__version__}))


if __name__ == "__main__":
    main()
