"""Whether the tasks that write a checkpoint see its location as this task does.

A checkpoint's variables and table shards are written by the tasks that hold them (stock
TensorFlow's saver runs on each parameter server, and so do tfps's table saves), so a
location that is local to each machine would scatter one checkpoint over several disks.
Stock TensorFlow then fails on the first parameter server that lacks the directory, with
a bare "No such file or directory"; this check fails first, naming the location and the
task that does not see it.
"""

import os
import uuid

import tensorflow as tf


def holding_tasks(objects):
    """The tasks ("/job:J/replica:R/task:T") whose devices hold any of `objects` (variables
    and resources such as table shards); objects without a task's device, or on this
    process's own devices outside a cluster (/job:localhost), are left out."""
    tasks = set()
    for obj in objects:
        if isinstance(obj, tf.Variable):
            device = obj.device
        elif isinstance(obj, tf.saved_model.experimental.TrackableResource):
            device = obj.resource_handle.device
        else:
            continue
        spec = tf.DeviceSpec.from_string(device or "")
        if spec.job not in (None, "localhost"):
            tasks.add(f"/job:{spec.job}/replica:{spec.replica or 0}/task:{spec.task or 0}")
    return tasks


def check_shared(directory, tasks):
    """Writes a file in `directory` (which exists) here and has each of `tasks` look for it;
    raises FailedPreconditionError naming the first task that does not see it."""
    if not tasks:
        return
    probe = os.path.join(directory, f".tfps-location-check-{uuid.uuid4().hex}")
    with tf.io.gfile.GFile(probe, "w") as f:
        f.write("a file every task that writes a checkpoint here must see\n")
    try:
        for task in sorted(tasks):
            with tf.device(f"{task}/device:CPU:0"):
                try:
                    seen = int(tf.size(tf.io.matching_files(probe)))
                except tf.errors.NotFoundError:
                    seen = 0
            if not seen:
                raise tf.errors.FailedPreconditionError(None, None, (
                    f"tfps: the checkpoint location {directory} is not the same storage on {task} as "
                    f"here: the file {probe} written here is not visible on {task}; every task must "
                    "reach the checkpoint location (shared storage: a network file system, a bucket), "
                    "since each writes the variables and table shards it holds: a local path names a "
                    "different disk on each machine"))
    finally:
        tf.io.gfile.remove(probe)
