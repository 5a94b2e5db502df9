"""Exports of a table's rows for a vector index: every key with its vector, or what changed
since the last export, written by each parameter server for its own shard.

An export is a directory: per shard i of n, `shard-<i>-of-<n>.keys.npy` (int64 [rows]),
`shard-<i>-of-<n>.vectors.npy` (float32 [rows, dim]) and `shard-<i>-of-<n>.removed_keys.npy`
(int64: the keys removed since the export before; empty in a whole one), written by
Tfps>TableExportForRetrieval on the shard's device, so no row passes through the chief;
then `retrieval.json`, written by the chief once every shard's files are in place: the
dim, the number of shards, the export's id, and each shard's kind ("whole" or "changes"),
counts and, for changes, the id of the export they follow (`follows`). A directory
without `retrieval.json` is an export that did not finish.

Exports of changes follow a chain (a name, "retrieval" by default): each holds the rows
inserted or changed and the keys removed since the chain's last export, read from the
table's change record as checkpoints read it, so they neither take nor break the changes
of a checkpoint chain. The chain moves on only once the whole export is written. A shard
that cannot tell its changes (a fresh process, a restore or clear since) writes whole.

Keys are the table's: for integer IDs looked up without a namespace they are the IDs;
otherwise `tfps.keys.ids_to_keys(ids, namespace)` gives them. `np.load` reads every file,
so a vector index needs neither TensorFlow nor tfps; `load_for_retrieval` applies a whole
export and the changes after it in order, and refuses exports of changes given after any
export but the one they follow (out of order, or one left out between them).
"""

import json
import os
import random

import numpy as np
import tensorflow as tf

from tfps import _arguments as arguments
from tfps import _durable as durable
from tfps._ops import ops
from tfps.table.sharded_table import on_every_shard

MANIFEST = "retrieval.json"
DEFAULT_CHAIN = "retrieval"
_KINDS = ("whole", "changes")


def _shards_of(table_or_layer):
    """(shard tables, their devices) of a DynamicEmbedding layer, ShardedTable or DynamicTable."""
    table = getattr(table_or_layer, "table", table_or_layer)
    if hasattr(table, "shards"):
        return table.shards, table.devices
    if hasattr(table, "resource_handle"):
        return [table], [None]
    raise TypeError(f"tfps.export.save_for_retrieval: expected a DynamicEmbedding, ShardedTable or "
                    f"DynamicTable, got {type(table).__name__}")


def shard_prefix(directory, index, num_shards):
    return os.path.join(directory, f"shard-{index}-of-{num_shards}")


def save_for_retrieval(table_or_layer, directory, changes_only=False, chain=DEFAULT_CHAIN):
    """Writes the keys and vectors of a DynamicEmbedding's table (or of a ShardedTable or
    DynamicTable) under `directory` (see the module docstring): every row, or with
    `changes_only` the rows changed since the last export of `chain`: inserted, trained,
    or looked up in training (which counts and stamps a row), and the keys removed.
    Returns the manifest (also written as directory/retrieval.json). Eager."""
    owner = "tfps.export.save_for_retrieval"
    if not isinstance(chain, str) or not chain:
        raise ValueError(f"{owner}: chain must be a non-empty string, got {chain!r}")
    directory = arguments.path(directory, "directory", owner)
    changes_only = arguments.boolean(changes_only, "changes_only", owner)
    shards, devices = _shards_of(table_or_layer)
    if tf.io.gfile.isdir(directory) and tf.io.gfile.listdir(directory):
        holds = ("already holds an export" if tf.io.gfile.exists(os.path.join(directory, MANIFEST))
                 else "is not empty")
        raise ValueError(f"{owner}: {directory} {holds}; write each export to a new (or empty) "
                         "directory, where no other file can be taken for part of it")
    tf.io.gfile.makedirs(directory)
    num_shards = len(shards)

    def export(i):
        with tf.device(devices[i]):
            return ops.tfps_table_export_for_retrieval(
                shards[i].resource_handle, shard_prefix(directory, i, num_shards),
                changes_only=changes_only, chain=chain)

    written = on_every_shard([lambda i=i: export(i) for i in range(num_shards)])
    export_id = random.getrandbits(62) + 1

    def shard_entry(rows, removed, kind, follows):
        entry = {"kind": _KINDS[int(kind)], "rows": int(rows), "removed": int(removed)}
        return {**entry, "follows": int(follows)} if entry["kind"] == "changes" else entry

    manifest = {"format": 2, "dim": int(shards[0].dim), "num_shards": num_shards, "chain": chain,
                "export_id": export_id,
                "shards": [shard_entry(rows, removed, kind, follows) for rows, removed, kind, _, follows in written]}
    with tf.io.gfile.GFile(os.path.join(directory, MANIFEST + ".tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    # The shards' files on disk before the manifest that names them.
    durable.sync_files(tf.io.gfile.glob(os.path.join(directory, "*.npy")))
    durable.replace(os.path.join(directory, MANIFEST + ".tmp"), os.path.join(directory, MANIFEST))
    for shard, device, (_, _, _, stamp, _) in zip(shards, devices, written):
        with tf.device(device):
            ops.tfps_table_commit_save(shard.resource_handle, directory, export_id, stamp, chain=chain)
    return manifest


def read_manifest(directory):
    path = os.path.join(directory, MANIFEST)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"tfps.export.load_for_retrieval: {directory} has no {MANIFEST}: not a "
                         "retrieval export, or one that did not finish")
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def _load_array(path):
    with tf.io.gfile.GFile(path, "rb") as f:
        return np.load(f)


def _check_each_follows_the_one_before(directories, manifests):
    """Exports of changes apply only after the export they follow: given after any other,
    they would keep rows removed since and lose rows changed in the export left out.
    (Exports written before the manifest recorded ids, format 1, are not checked.)"""
    for position in range(1, len(directories)):
        before, manifest = manifests[position - 1], manifests[position]
        for i, shard in enumerate(manifest["shards"]):
            if shard["kind"] != "changes" or "follows" not in shard or "export_id" not in before:
                continue
            if shard["follows"] != before["export_id"]:
                raise ValueError(
                    f"tfps.export.load_for_retrieval: {directories[position]} (shard {i}) holds the changes "
                    f"since {_export_named(shard['follows'], directories, manifests, position)}, not since "
                    f"{directories[position - 1]}, which it is given after: give a whole export and then "
                    "every export of changes of its chain, in the order they were written")


def _export_named(export_id, directories, manifests, position):
    """Which of `directories` wrote `export_id`, as an error about the export at `position`
    says it: given earlier, given later, or not given at all."""
    for index, (directory, manifest) in enumerate(zip(directories, manifests)):
        if manifest.get("export_id") == export_id:
            return f"{directory}, given later" if index > position else directory
    return "an export not given"


def load_for_retrieval(*directories):
    """(keys int64 [n], vectors float32 [n, dim]) as of the last of `directories`: a whole
    export, then exports of changes of its chain in the order they were written. Keys
    ascending."""
    if not directories:
        raise ValueError("tfps.export.load_for_retrieval: give at least one export directory")
    if len({os.path.abspath(d) for d in directories}) != len(directories):
        raise ValueError(f"tfps.export.load_for_retrieval: an export is given twice in {directories}")
    manifests = [read_manifest(directory) for directory in directories]
    for directory, manifest in zip(directories[1:], manifests[1:]):
        if (manifest["dim"], manifest["chain"]) != (manifests[0]["dim"], manifests[0]["chain"]):
            raise ValueError(
                f"tfps.export.load_for_retrieval: {directory} (dim {manifest['dim']}, chain "
                f"{manifest['chain']!r}) does not follow {directories[0]} (dim {manifests[0]['dim']}, "
                f"chain {manifests[0]['chain']!r}): exports of one table's chain only")
    _check_each_follows_the_one_before(directories, manifests)
    dim = manifests[-1]["dim"]
    keys, vectors = np.zeros([0], np.int64), np.zeros([0, dim], np.float32)
    for position, (directory, manifest) in enumerate(zip(directories, manifests)):
        n = manifest["num_shards"]
        for i, shard in enumerate(manifest["shards"]):
            prefix = shard_prefix(directory, i, n)
            if shard["kind"] == "changes" and position == 0:
                raise ValueError(f"tfps.export.load_for_retrieval: {directory} holds changes; the "
                                 "first export must be a whole one")
            new_keys = _load_array(prefix + ".keys.npy")
            dropped = np.isin(keys, _load_array(prefix + ".removed_keys.npy")) | np.isin(keys, new_keys)
            if shard["kind"] == "whole" and position > 0 and len(keys):  # the shard starts again
                from tfps.table.keys import shard_of
                dropped |= shard_of(tf.constant(keys), n).numpy() == i
            keys = np.concatenate([keys[~dropped], new_keys])
            vectors = np.concatenate([vectors[~dropped], _load_array(prefix + ".vectors.npy")])
    order = np.argsort(keys, kind="stable")
    return keys[order], vectors[order].astype(np.float32, copy=False)
