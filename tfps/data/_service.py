"""The tf.data service of the examples: a dispatcher and its workers in the chief's process,
which hand each batch to one reader (distributed_epoch), on several hosts as on one.

Every address one task hands another must be one the other reaches: the dispatcher and its
workers advertise this task's own host, as its TF_CONFIG entry names it (what the other
tasks reach it at), not "localhost" (tf.data service's default, which on another host
names that host). A reader first checks that it reaches the dispatcher and its workers,
and fails within REACH_TIMEOUT_SECONDS with an error naming the address it cannot reach,
where tf.data service keeps retrying, each pause longer than the one before.
"""

import contextlib

import tensorflow as tf

from tfps._ops import ops
from tfps.cluster._ports import free_ports
from tfps.cluster.distribute import tf_config

__all__ = ["local_data_service", "distribute", "own_host", "REACH_TIMEOUT_SECONDS"]

REACH_TIMEOUT_SECONDS = 60.0
_WORKERS = {}  # the target of a local_data_service: the addresses its workers advertise


def own_host():
    """The host of this task's entry in TF_CONFIG's cluster spec ("localhost" without
    TF_CONFIG, or for a task the cluster spec does not list, such as an evaluator)."""
    config = tf_config()
    if config is None:
        return "localhost"
    task = config["task"]
    entries = config["cluster"].get(task["type"]) or []
    index = int(task.get("index", 0))
    if index >= len(entries):
        return "localhost"
    return entries[index].rsplit(":", 1)[0]


@contextlib.contextmanager
def local_data_service(num_workers=2):
    """An in-process tf.data service (a dispatcher and `num_workers` workers) that other
    hosts reach at this task's own address; yields its target for
    criteo_dataset(data_service=...) and DriftingStream.dataset(data_service=...)."""
    host = own_host()
    port, *worker_ports = free_ports(1 + num_workers)
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=port))
    protocol = dispatcher.target.split("://")[0]
    workers = [tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
        dispatcher_address=f"{host}:{port}", worker_address=f"{host}:{worker_port}", port=worker_port,
        data_transfer_address=f"{host}:%dts_port%")) for worker_port in worker_ports]
    target = f"{protocol}://{host}:{port}"
    _WORKERS[target] = [f"{host}:{worker_port}" for worker_port in worker_ports]
    try:
        yield target
    finally:
        _WORKERS.pop(target, None)
        del workers, dispatcher


def distribute(dataset, service, job_name, timeout_seconds=REACH_TIMEOUT_SECONDS):
    """`dataset` served by the tf.data service at `service` as job `job_name`
    (distributed_epoch: each element to one reader), once the reader has reached the
    dispatcher and, for a local_data_service, its workers: within `timeout_seconds`, or the
    reader fails with DeadlineExceededError naming the address (it runs where the dataset
    is made: on each worker under ParameterServerStrategy)."""
    addresses = [service] + _WORKERS.get(service, [])
    check = ops.tfps_check_reachable(addresses, timeout_seconds=timeout_seconds,
                                     what="the tf.data service (its dispatcher or a worker)")
    with tf.control_dependencies([] if check is None else [check]):  # None: it ran eagerly
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=service, job_name=job_name))
