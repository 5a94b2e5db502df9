"""Three savers of one table interleaved in every order with training, snapshots and
exports: restoring each saver's chain must give exactly the table as of that saver's last
save. Shared by tests/test_save_chains.py (a local table) and
tests/cluster_programs/pss_save_chains.py (a table sharded over parameter servers)."""

import itertools
import os

import numpy as np
import tensorflow as tf

import tfps
from tests.table_rows import sorted_rows

DIM = 3
STATE = ("rows", "clock", "admitted", "pending", "rejected", "evicted")


def make_table(table_class, **kwargs):
    return table_class(DIM, optimizer="adam", admission=tfps.admission.MinCount(2, sketch_bytes=0),
                       eviction=tfps.eviction.TTL(steps=4), **kwargs)


def table_state(table):
    """Rows, slots and metadata, and the admission and eviction state and clock."""
    stats = table.stats()
    return sorted_rows(table), {name: stats[name] for name in STATE}


def same_state(a, b):
    rows_a, stats_a = a
    rows_b, stats_b = b
    return (rows_a.keys() == rows_b.keys() and stats_a == stats_b and
            all(np.array_equal(rows_a[name], rows_b[name]) for name in rows_a))


class Saver:
    """One chain: its checkpoint paths since its last whole save, and the table's state as
    of its last save."""

    def __init__(self, name, table, directory, whole_every):
        self.name, self.whole_every = name, whole_every
        self.directory = os.path.join(directory, name)
        self.checkpoint = tf.train.Checkpoint(table=table)
        self.writer = tfps.checkpoint.TracedWriter(self.checkpoint)
        self.saves, self.chain, self.expected = 0, [], None
        self.of_changes = 0  # saves whose table files all hold changes (docs/checkpoints.md)

    def save(self, table):
        whole = self.saves % self.whole_every == 0
        prefix = os.path.join(self.directory, f"ckpt-{self.saves}")
        if self.name == "manager":  # a plain Checkpoint.write, as a CheckpointManager makes
            if whole:
                self.checkpoint.write(prefix)
            else:
                with tfps.checkpoint.changes_only():
                    self.checkpoint.write(prefix)
        else:
            self.writer.write(prefix, changes_only=not whole)
        self.chain = [prefix] if whole else self.chain + [prefix]
        self.saves += 1
        self.expected = table_state(table)
        files = tf.io.gfile.glob(prefix + "-tfps.DynamicTable.t0.shard-*")
        kinds = {int(np.frombuffer(tf.io.gfile.GFile(f, "rb").read(44), np.uint32, 1, 40)[0]) for f in files}
        self.of_changes += kinds == {1}


def train(table, rng, step):
    """Lookups that admit some keys (each twice) and only count others, applies to part of
    them, removals, and now and then an eviction sweep (TTL of 4 steps)."""
    keys = rng.integers(0, 600, size=80).astype(np.int64) + (step % 3) * 1000
    table.find_or_insert(np.concatenate([keys, keys[:40]]))
    table.apply_gradients(keys[:30], rng.normal(size=(30, DIM)).astype(np.float32), step=-1)
    table.remove(keys[70:75])
    if step % 5 == 4:
        table.evict()


def check_interleaved_savers(new_table, directory):
    """Runs every order of three savers (a backup chain of changes, a checkpoint directory
    of changes written by plain Checkpoint.write, whole epoch checkpoints), with training,
    snapshots and exports between. Returns {"restores": n, "mismatches": [...],
    "saves_of_changes": n}."""
    table = new_table()
    savers = [Saver("backup", table, directory, whole_every=4),
              Saver("manager", table, directory, whole_every=3),
              Saver("epoch", table, directory, whole_every=1)]
    rng = np.random.default_rng(7)
    mismatches, restores, step = [], 0, 0
    for order in itertools.permutations(range(3)):
        for saver_index in order:
            train(table, rng, step)
            step += 1
            savers[saver_index].save(table)
            tfps.checkpoint.snapshot(table)  # a .keras save's copy: in no chain
            table.export()
        for saver in savers:
            restored = new_table()
            reader = tf.train.Checkpoint(table=restored)
            for path in saver.chain:
                reader.read(path).expect_partial()
            restores += 1
            if not same_state(table_state(restored), saver.expected):
                mismatches.append(f"{saver.name} after order {order}: chain {saver.chain}")
    changes = sum(saver.of_changes for saver in savers)
    return {"restores": restores, "mismatches": mismatches, "saves_of_changes": changes}
