"""tf.data service with InTune (docs/service.md): TensorFlow's own
`DispatchServer` and `WorkerServer` with InTune loaded, every worker tuned
within budgets of its own and writing a status file (`worker_status()`,
`intune inspect --service`). The servers have no authentication and listen
on all interfaces (`worker.SECURITY_NOTE`).

By job: `cli` (the commands), `dispatcher` and `worker` (the two servers;
`worker` also holds what their processes share), `consumer` (the trainer's
`ConsumerMeter` and the dispatcher's reading of it), `controllers` (how big
the pool should be), `manager` (a controller driving a scaler), `scalers`
(commands, callbacks, tiers), `workers` (this host's worker processes),
`addresses` (HOST:PORT parsed and resolved, free ports).
"""

from intune_tf.service.addresses import ServiceError
from intune_tf.service.addresses import check_port_free
from intune_tf.service.addresses import parse_address
from intune_tf.service.cli import add_commands
from intune_tf.service.consumer import ConsumerMeter
from intune_tf.service.consumer import dispatcher_pool
from intune_tf.service.consumer import pool_reading
from intune_tf.service.consumer import worker_status
from intune_tf.service.dispatcher import cpu_note
from intune_tf.service.dispatcher import run_dispatcher
from intune_tf.service.worker import standby_port

__all__ = [
    "ConsumerMeter", "ServiceError", "add_commands", "check_port_free",
    "cpu_note", "dispatcher_pool", "parse_address", "pool_reading",
    "run_dispatcher", "standby_port", "worker_status",
]
