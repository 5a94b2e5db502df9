"""Parameter-server clusters: an in-process local cluster for tests and demos."""

import contextlib
import os
import tempfile

import tensorflow as tf

from tfps.cluster._ports import free_ports

# On a 2-core machine an in-process cluster deadlocks unless every server gets enough
# inter-op threads: workers and parameter servers block threads waiting on each other.
SERVER_INTER_OP_THREADS = 8


def server_config():
    """ConfigProto for a tf.distribute.Server of a PS or worker task."""
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = SERVER_INTER_OP_THREADS
    return config


@contextlib.contextmanager
def local_cluster(num_workers=2, num_ps=2, variable_partitioner=None):
    """Starts `num_workers` workers and `num_ps` parameter servers in this process, on
    127.0.0.1, and yields a ParameterServerStrategy whose coordinator is this process
    (with `variable_partitioner`, if given).

    Servers of an in-process cluster live until the process exits (TensorFlow cannot stop
    them); run one cluster per process.
    """
    if num_workers < 1 or num_ps < 1:
        raise ValueError(f"local_cluster needs at least one worker and one ps, got "
                         f"num_workers={num_workers}, num_ps={num_ps}")
    ports = free_ports(num_workers + num_ps)
    spec = {"worker": [f"127.0.0.1:{p}" for p in ports[:num_workers]],
            "ps": [f"127.0.0.1:{p}" for p in ports[num_workers:]]}
    cluster = tf.train.ClusterSpec(spec)
    servers = []
    for job, count in (("worker", num_workers), ("ps", num_ps)):
        for i in range(count):
            servers.append(tf.distribute.Server(cluster, job_name=job, task_index=i,
                                                protocol="grpc", config=server_config(),
                                                start=True))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)
    yield strategy
    del servers  # kept alive for the strategy's lifetime


def run_directory(program):
    """A directory of this run's own for `program`'s outputs: under tfps-launch one per
    launch (TFPS_LAUNCH_ID), which the restarts of its cluster share, so a restarted run
    finds its backups; else a fresh one."""
    launch = os.environ.get("TFPS_LAUNCH_ID")
    if launch:
        return os.path.join(tempfile.gettempdir(), f"tfps-{program}", launch)
    return tempfile.mkdtemp(prefix=f"tfps-{program}-")


def tf_config():
    """The parsed TF_CONFIG environment variable, or None."""
    import json
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        config["cluster"], config["task"]["type"]  # noqa: B018  (both must be there)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"tfps.distribute: TF_CONFIG is not a valid cluster config ({e}): {raw!r}") from e
    return config


def strategy_from_tf_config(variable_partitioner=None):
    """The strategy for this process, from TF_CONFIG.

    In a ps or worker task this starts the task's server (with the thread settings that
    keep small machines from deadlocking) and blocks for the life of the cluster; the op
    library is already loaded, since importing tfps loads it. In the chief it returns a
    ParameterServerStrategy; in an evaluator, and with no TF_CONFIG, the default strategy
    (local training).
    """
    config = tf_config()
    if config is None:
        return tf.distribute.get_strategy()
    task_type = config["task"]["type"]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if task_type in ("ps", "worker"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=task_type,
                                      task_index=resolver.task_id, protocol="grpc",
                                      config=server_config(), start=True)
        server.join()
        raise SystemExit(0)  # join() returns only when the server is stopped
    if task_type == "chief":
        return tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=variable_partitioner)
    return tf.distribute.get_strategy()
