"""tf.data service with InTune: launchers, per-worker budgets, worker status.

    intune service dispatcher --port 5050
    intune service worker --dispatcher 127.0.0.1:5050 --port 5051

start TensorFlow's own `DispatchServer` and `WorkerServer` in a process that
has loaded the InTune kernel library and started the tuner. A dataset with
`experimental_intune` on, distributed with
`tf.data.experimental.service.distribute` (or `register_dataset`), is then
tuned on every worker:

- TF's `distribute` registers the dataset through
  `DatasetV2._apply_debug_options`, which InTune hooks: the `IntuneRootDataset`
  root goes on top of the graph sent to the dispatcher, and the option
  travels in that graph (`IntuneOptionsDataset`). Each worker builds the
  graph and the root rewrites the pipeline there, so every iterator a worker
  creates is a tuning session of the worker process, stepped by the worker's
  tuner. The client's side of `distribute` is not under the root: set the
  option before `distribute`, not on the distributed dataset.
- Budgets are per worker: `cpu_budget` is capped by each worker's usable
  CPUs at every step; a `ram_budget` left at None is resolved by each
  worker's tuner from its own available memory when the worker makes the
  iterator (the graph carries no bytes for it), then shared among the
  worker's sessions (`tuner.default_budget_shares`).
- Each worker writes a status file (`intune_tf.observe.status`) with the
  per-stage table of its sessions. `worker_status()` and
  `intune inspect --service` read them (same host, or a status dir shared by
  all hosts).

tf.data service has no authentication and no encryption: anyone who can
reach the ports can read the data and submit work. TensorFlow's servers
listen on all network interfaces whatever `--host` says (`--host` is the
address they advertise); keep them on a private network or behind a firewall.

The subpackage, by job: `cli` (the commands), `dispatcher` and `worker` (the
two servers), `consumer` (the trainer's `ConsumerMeter` and the dispatcher's
reading of it), `controllers` (how big the pool should be), `manager` (a
controller driving a scaler), `scalers` (commands, callbacks, tiers),
`workers` (this host's worker processes), `addresses` and `process` (what
the others share).
"""

from intune_tf.service.addresses import ServiceError
from intune_tf.service.addresses import check_port_free
from intune_tf.service.addresses import endpoints
from intune_tf.service.addresses import parse_address
from intune_tf.service.cli import add_commands
from intune_tf.service.cli import pool_flags_problem
from intune_tf.service.consumer import CONSUMER_REPORT_MAX_AGE_S
from intune_tf.service.consumer import CONSUMER_REPORT_PERIOD_S
from intune_tf.service.consumer import ConsumerMeter
from intune_tf.service.consumer import dispatcher_pool
from intune_tf.service.consumer import pool_reading
from intune_tf.service.consumer import worker_status
from intune_tf.service.dispatcher import cpu_note
from intune_tf.service.dispatcher import run_dispatcher
from intune_tf.service.process import SECURITY_NOTE
from intune_tf.service.worker import DEFAULT_DISPATCHER_WAIT_S
from intune_tf.service.worker import run_worker
from intune_tf.service.worker import standby_port
from intune_tf.service.worker import wait_for_dispatcher

__all__ = [
    "CONSUMER_REPORT_MAX_AGE_S", "CONSUMER_REPORT_PERIOD_S",
    "DEFAULT_DISPATCHER_WAIT_S", "SECURITY_NOTE", "ConsumerMeter",
    "ServiceError", "add_commands", "check_port_free", "cpu_note",
    "dispatcher_pool", "endpoints", "parse_address", "pool_flags_problem",
    "pool_reading", "run_dispatcher", "run_worker", "standby_port",
    "wait_for_dispatcher", "worker_status",
]
