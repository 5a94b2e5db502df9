"""The rows a serving export holds, and how stock ops find them.

A table shard's rows in an export are layers: a whole layer (every row, in serving order,
written by Tfps>TableExportForServing) and, in exports of changes, the layers of changes
after it (Tfps>TableExportChangesForServing): the rows changed since the version before and
the keys serving must stop finding. Lookups consult a shard's layers newest first; the
first layer that holds a key, or removed it, decides. Each layer is a tensor bundle that
its shard's device (under ParameterServerStrategy, its parameter server) writes, so no row
passes through the chief, under the variable names a SavedModel gives its stand-ins
(`frozen_rows/<layer>_order`, `_values`, `_removed`).

Every export keeps its layers' bundles under `tfps_rows/` (hard links to the files merged
into its variables; copies where the filesystem has no links) with `layers.json`, which an
export of changes reads to reuse them: a version costs the rows that changed, not the
table. A chain of exports moves on (Tfps>TableCommitSave) only once a version is complete.
"""

import functools
import json
import os
import re

import numpy as np
import tensorflow as tf

from tfps._ops import ops
from tfps.table import _stock_ops as stock_ops
from tfps.table.sharded_table import on_every_shard

LAYERS_DIR = "tfps_rows"
LAYERS_MANIFEST = "layers.json"
VARIABLE_KEY = "frozen_rows/{}/.ATTRIBUTES/VARIABLE_VALUE"


def _sorted_lookup(sorted_order, count, order):
    """(positions, found) of `order` in the ascending int64 variable `sorted_order`."""
    if count == 0:
        return tf.zeros(tf.shape(order), tf.int64), tf.zeros(tf.shape(order), tf.bool)
    last = tf.shape(sorted_order, out_type=tf.int64)[0] - 1
    position = tf.minimum(tf.searchsorted(sorted_order, order, out_type=tf.int64), last)
    return position, tf.equal(tf.gather(sorted_order, position), order)


class FrozenTable(tf.Module):
    """The rows of one layer of a table shard for serving: `order` int64 [n], the serving
    order of its keys ascending, and `values` [n, dim] in that order: float32, or float16
    values as their int16 bit patterns (as the export ops write them); for a layer of
    changes also `removed` int64 [r], the serving order of keys it removed. Created empty
    (their first dimension unknown): the export writes the rows into the SavedModel."""

    def __init__(self, num_rows, dim, value_dtype, num_removed=None, name=None):
        super().__init__(name=name)
        self.num_rows = num_rows
        self.num_removed = num_removed
        self.value_dtype = value_dtype
        stored = tf.int16 if value_dtype == tf.float16 else tf.float32
        self.order = tf.Variable(tf.zeros([0], tf.int64), shape=[None], trainable=False, name="order")
        self.values = tf.Variable(tf.zeros([0, dim], stored), shape=[None, dim],
                                  trainable=False, name="values")
        if num_removed is not None:
            self.removed = tf.Variable(tf.zeros([0], tf.int64), shape=[None], trainable=False, name="removed")

    def stand_ins(self, name):
        """{variable name: stand-in}: the names its layer's bundle uses."""
        out = {f"{name}_order": self.order, f"{name}_values": self.values}
        if self.num_removed is not None:
            out[f"{name}_removed"] = self.removed
        return out

    def find_order(self, order):
        """(float32 rows [n, dim], exists [n], removed [n]) of keys in serving order."""
        position, exists = _sorted_lookup(self.order, self.num_rows, order)
        if self.num_rows == 0:
            rows = tf.zeros([tf.shape(order)[0], self.values.shape[1]], tf.float32)
        else:
            rows = tf.gather(self.values, position)
            if self.value_dtype == tf.float16:
                rows = tf.bitcast(rows, tf.float16)
            rows = tf.where(exists[:, None], tf.cast(rows, tf.float32), 0.0)
        _, removed = _sorted_lookup(getattr(self, "removed", None), self.num_removed or 0, order)
        return rows, exists, removed

    def find(self, keys):
        """(float32 rows [n, dim], exists [n]) of int64 keys [n]; absent rows are zeros."""
        rows, exists, _ = self.find_order(stock_ops.serving_order(keys))
        return rows, exists


class LayeredShard(tf.Module):
    """A table shard's layers, oldest (whole) first; the newest that holds or removed a key
    decides it."""

    def __init__(self, layers, name=None):
        super().__init__(name=name)
        self.layers = list(layers)

    @property
    def num_rows(self):
        """The rows its layers hold (a key in several layers counts in each)."""
        return sum(layer.num_rows for layer in self.layers)

    def find(self, keys):
        if len(self.layers) == 1:
            return self.layers[0].find(keys)
        order = stock_ops.serving_order(keys)
        rows = exists = decided = None
        for layer in reversed(self.layers):
            layer_rows, found, removed = layer.find_order(order)
            if rows is None:
                rows, exists, decided = layer_rows, found, found | removed
                continue
            take = found & ~decided
            rows = tf.where(take[:, None], layer_rows, rows)
            exists = exists | take
            decided = decided | found | removed
        return rows, exists


class ShardedFrozenTable(tf.Module):
    """One frozen shard per shard of a trained table; keys route to them as in training."""

    def __init__(self, shards, name=None):
        super().__init__(name=name)
        self.shards = list(shards)

    @property
    def num_rows(self):
        return sum(shard.num_rows for shard in self.shards)

    def find(self, keys):
        """(float32 rows [n, dim], exists [n]) of int64 keys [n]."""
        if len(self.shards) == 1:
            return self.shards[0].find(keys)
        positions, parts = stock_ops.partition_by_shard(
            keys, stock_ops.shard_of(keys, len(self.shards)), len(self.shards))
        found = [shard.find(part) for shard, part in zip(self.shards, parts)]
        return (tf.dynamic_stitch(positions, [rows for rows, _ in found]),
                tf.dynamic_stitch(positions, [exists for _, exists in found]))


def value_dtype_of(value_dtype, caller="save_for_serving"):
    refusal = f"{caller}: value_dtype must be float32 or float16, got {value_dtype!r}"
    if not isinstance(value_dtype, tf.dtypes.DType):
        try:
            value_dtype = tf.as_dtype(np.dtype(value_dtype or np.float32))
        except TypeError:  # not a dtype at all ("float8", an object): numpy's error names no argument
            raise ValueError(refusal) from None
    if value_dtype not in (tf.float32, tf.float16):
        raise ValueError(f"{caller}: value_dtype must be float32 or float16, got {value_dtype.name}")
    return value_dtype


def _float16_error(layer_name, shard_index, error):
    found = re.search(r"float16 cannot hold (.*?) \(it rounds", error.message)
    if found is None:
        return None
    return ValueError(f"save_for_serving: value_dtype=float16 cannot hold the rows of '{layer_name}': "
                      f"shard {shard_index} has {found.group(1)}, which float16 would serve as inf; "
                      "export in float32")


def _export_shard(shard, prefix, name, min_count, value_dtype, follows=None, chain=None):
    """Writes one shard's layer at `prefix` on the shard's device: its changes since the
    export `follows` of `chain` when given and the table can tell them, else every row.
    Returns (the layer's manifest entry, the stamp its chain records)."""
    keys = {part: VARIABLE_KEY.format(f"{name}_{part}") for part in ("order", "values", "removed")}
    with tf.device(shard.resource_handle.device):
        if follows is not None:
            rows, removed, written, stamp = ops.tfps_table_export_changes_for_serving(
                shard.resource_handle, prefix, follows, hashes_key=keys["order"], values_key=keys["values"],
                removed_key=keys["removed"], value_dtype=value_dtype, min_count=min_count, chain=chain)
            if bool(written):
                return {"name": name, "kind": "changes", "rows": int(rows), "removed": int(removed)}, int(stamp)
        rows, stamp = ops.tfps_table_export_for_serving(
            shard.resource_handle, prefix, hashes_key=keys["order"], values_key=keys["values"],
            value_dtype=value_dtype, min_count=min_count)
        return {"name": name, "kind": "whole", "rows": int(rows)}, int(stamp)


def freeze(layer, directory, table_name, min_count=None, value_dtype=None):
    """Writes the rows of a DynamicEmbedding's table whose occurrence count is >= min_count
    as one whole layer per shard, `directory/<table_name>_shard<i>`, all shards at once.
    Returns (a ShardedFrozenTable of empty stand-ins, the bundles' prefixes, {stand-in
    name: variable})."""
    plan = write_layers(layer, directory, table_name, min_count or 0, value_dtype_of(value_dtype))
    return plan.frozen, plan.prefixes, plan.variables


class LayersPlan:
    """What write_layers wrote for one table: its frozen stand-ins, the bundles the
    SavedModel's variables merge (this version's and the reused ones'), the variables
    named as in those bundles, each shard's layers for the manifest and the stamps."""

    def __init__(self, frozen, prefixes, variables, shard_layers, stamps, reused):
        self.frozen, self.prefixes, self.variables = frozen, prefixes, variables
        self.shard_layers, self.stamps, self.reused = shard_layers, stamps, reused


def write_layers(layer, directory, table_name, min_count, value_dtype, previous=None, export_id=None,
                 max_change_layers=None, max_layered_rows=None):
    """Writes this version's layer of each shard of `layer`'s table under `directory`: whole,
    or with `previous` (the shards' layers in the version followed, from its manifest, and
    that version's `tfps_rows` directory and export id) the changes since, reusing the
    layers before. A shard is written whole instead when it already has
    `max_change_layers` layers of changes, when its table cannot tell its changes, or when
    its layers would hold more than `max_layered_rows` times the shard's rows (rows
    changed again and again are held once per layer). The reused bundles are linked into
    `directory`."""
    shards = layer.table.shards
    suffix = "" if export_id is None else f"_v{export_id:x}"
    names = [f"{table_name}_shard{i}{suffix}" for i in range(len(shards))]
    prefixes = [os.path.join(directory, name) for name in names]

    def export_or_raise(i, follows):
        try:
            return _export_shard(shards[i], prefixes[i], names[i], min_count, value_dtype, follows,
                                 previous and previous["chain"])
        except tf.errors.InvalidArgumentError as e:
            error = _float16_error(layer.name, i, e)
            if error is None:
                raise
            raise error from None

    def export(i):
        before = previous["shards"][i] if previous else None
        if before is None or len(before) - 1 >= max_change_layers:
            return export_or_raise(i, None)
        entry, stamp = export_or_raise(i, previous["export_id"])
        if entry["kind"] == "changes":
            layered = sum(kept["rows"] for kept in before) + entry["rows"]
            with tf.device(shards[i].resource_handle.device):
                rows_now = int(shards[i].size())
            if layered > max_layered_rows * max(1, rows_now):
                for path in tf.io.gfile.glob(prefixes[i] + ".*"):
                    tf.io.gfile.remove(path)
                return export_or_raise(i, None)
        return entry, stamp

    written = on_every_shard([functools.partial(export, i) for i in range(len(shards))])
    frozen_shards, variables, shard_layers, reused = [], {}, [], []
    for i, (shard, (entry, _)) in enumerate(zip(shards, written)):
        layers = list(previous["shards"][i]) if previous and entry["kind"] == "changes" else []
        for kept in layers:
            reused.append(kept["name"])
        if entry["kind"] == "whole" or entry["rows"] or entry["removed"]:
            layers.append(entry)
        else:  # nothing changed: the layers before serve as they are
            for path in tf.io.gfile.glob(prefixes[i] + ".*"):
                tf.io.gfile.remove(path)
        frozen_layers = []
        with tf.device(shard.resource_handle.device):
            for kept in layers:
                frozen = FrozenTable(kept["rows"], layer.table.dim, value_dtype,
                                     kept.get("removed") if kept["kind"] == "changes" else None,
                                     name=f"{layer.name}_{kept['name']}")
                frozen_layers.append(frozen)
                variables.update(frozen.stand_ins(kept["name"]))
        frozen_shards.append(LayeredShard(frozen_layers, name=f"{layer.name}_frozen{i}"))
        shard_layers.append(layers)
    for name in reused:
        link_bundle(os.path.join(previous["directory"], name), os.path.join(directory, name))
    bundle_prefixes = [os.path.join(directory, kept["name"]) for layers in shard_layers for kept in layers]
    return LayersPlan(ShardedFrozenTable(frozen_shards, name=f"{layer.name}_frozen"), bundle_prefixes,
                      variables, shard_layers, [stamp for _, stamp in written], reused)


def link_bundle(source_prefix, target_prefix):
    """Hard-links a tensor bundle's files (copies them where links cannot be made)."""
    for path in tf.io.gfile.glob(source_prefix + ".*"):
        target = target_prefix + path[len(source_prefix):]
        try:
            os.link(path, target)
        except OSError:
            tf.io.gfile.copy(path, target, overwrite=True)


def read_previous(export_dir, layers, chain, min_count, value_dtype):
    """The manifest of the export an export of changes follows, checked against the model
    and arguments; (manifest, min_count, value_dtype) with the ones not given taken from it."""
    path = os.path.join(export_dir, LAYERS_DIR, LAYERS_MANIFEST)
    if not tf.io.gfile.isdir(export_dir):
        raise ValueError(f"save_for_serving: changes_since={export_dir} does not exist")
    if not tf.io.gfile.exists(path):
        raise ValueError(f"save_for_serving: changes_since={export_dir} is not a serving export that "
                         f"keeps its rows ({LAYERS_DIR}/{LAYERS_MANIFEST} is missing): give the "
                         "directory of a finished tfps.export.save_for_serving export")
    with tf.io.gfile.GFile(path) as f:
        manifest = json.load(f)
    if chain is not None and chain != manifest["chain"]:
        raise ValueError(f"save_for_serving: changes_since={export_dir} is on chain "
                         f"{manifest['chain']!r}, not {chain!r}")
    for name, given, kept in (("min_count", min_count, manifest["min_count"]),
                              ("value_dtype", None if value_dtype is None else value_dtype_of(value_dtype).name,
                               manifest["value_dtype"])):
        if given is not None and given != kept:
            raise ValueError(f"save_for_serving: {name}={given} differs from the export it follows "
                             f"({export_dir}: {kept}); an export of changes keeps its base's")
    described = [{"layer": layer.name, "dim": layer.table.dim, "shards": len(layer.table.shards)}
                 for layer in layers]
    kept = [{"layer": t["layer"], "dim": t["dim"], "shards": len(t["shards"])} for t in manifest["tables"]]
    if described != kept:
        raise ValueError(f"save_for_serving: the model's tables {described} are not those of the export "
                         f"it follows ({export_dir}: {kept})")
    manifest["directory"] = os.path.join(export_dir, LAYERS_DIR)
    return manifest, manifest["min_count"], tf.as_dtype(manifest["value_dtype"])


def write_manifest(directory, export_id, chain, min_count, value_dtype, layers, plans):
    manifest = {"format": 1, "export_id": export_id, "chain": chain, "min_count": min_count,
                "value_dtype": value_dtype.name,
                "tables": [{"layer": layer.name, "dim": layer.table.dim, "shards": plan.shard_layers}
                           for layer, plan in zip(layers, plans)]}
    with tf.io.gfile.GFile(os.path.join(directory, LAYERS_MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def previous_of_table(manifest, index):
    """write_layers' `previous` for the manifest's table `index`."""
    return {"shards": manifest["tables"][index]["shards"], "export_id": manifest["export_id"],
            "chain": manifest["chain"], "directory": manifest["directory"]}


def commit(layers, plans, export_dir, export_id, chain):
    """Moves each shard's chain on to this export, once it is complete."""
    calls = []
    for layer, plan in zip(layers, plans):
        for shard, stamp in zip(layer.table.shards, plan.stamps):
            def call(shard=shard, stamp=stamp):
                with tf.device(shard.resource_handle.device):
                    ops.tfps_table_commit_save(shard.resource_handle, export_dir, export_id, stamp, chain=chain)
            calls.append(call)
    on_every_shard(calls)
