"""Where a table's rows live: all in memory (`InMemory`, the default) or `Tiered`, with the
hot rows' values and slots in memory and the rest on the parameter server's local disk.

A tiered table keeps every key and its metadata (count, last-seen step, score: what
admission, eviction, `contains` and stats read) in memory, and the payload (value and
optimizer slots) of at most `memory_rows` rows; the others' payloads are in a RocksDB
store under `path` on the parameter server's own disk. A lookup or update that needs a
payload on disk reads it (one batched read per call and shard) and keeps it in memory;
after each call, rows beyond the budget are demoted, lowest-ranked first by the table's
eviction policy (least recently seen by default, least often seen under LFU, lowest score
under DecayedFrequency), and written only if they changed since they were last written.
Values, slots and metadata are those of the same table in memory, bit for bit.

The disk tier is a cache of the table, not its checkpoint: a table opening its directory
wipes what is there (a killed task's files are never read), checkpoints and exports write
every row from either tier, and a restarted task starts from the last backup as always.
docs/tiered.md gives the costs and figures.
"""

import os
import threading
import weakref

from tfps import _arguments as arguments
from tfps.table._configurable import Configurable, Kind


class Storage(Configurable):
    """Base: the attributes Tfps>TableCreate takes."""

    def shares(self, payload_bytes, num_shards):
        """The storage of each of `num_shards` shards of a table whose rows' payloads take
        `payload_bytes` each."""
        return [self] * num_shards

    def op_attrs(self, shard_name, payload_bytes):
        """The create op's attributes for the table (or shard) named `shard_name`."""
        return {}

    def claim_directory(self, owner, table_name):
        return table_name


class InMemory(Storage):
    """Every row in the parameter server's memory (the default)."""


# Bytes a payload in memory takes beyond its floats: the block's header (its row and number).
PAYLOAD_BLOCK_OVERHEAD = 16


class Tiered(Storage):
    """Hot rows in memory, the rest on the parameter server's local disk (RocksDB).

    Args (one of memory_rows or memory_bytes):
      path: a directory on each parameter server's own disk (an absolute path: it is read
        where the table lives). Each shard of each table takes a subdirectory named after
        it, wiped when the table is created and removed when it is destroyed.
      memory_rows: how many rows' payloads (value and slots) the table keeps in memory,
        split evenly over its shards.
      memory_bytes: the same as bytes of payload blocks: each row takes
        4 * dim * (1 + optimizer slots) + 16 bytes.
      cache_bytes: the disk store's block cache per shard (its memtables take up to another
        64 MiB per shard while writes are buffered).
    """

    def __init__(self, path, memory_rows=None, memory_bytes=None, cache_bytes=32 << 20):
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"Tiered: path must be a directory on the parameter servers' disks, got {path!r}")
        if not os.path.isabs(os.fspath(path)):
            raise ValueError(f"Tiered: path must be absolute (it is read on each parameter server), got {path!r}")
        if (memory_rows is None) == (memory_bytes is None):
            raise ValueError(f"Tiered: give exactly one of memory_rows or memory_bytes, got memory_rows="
                             f"{memory_rows!r}, memory_bytes={memory_bytes!r}")
        if memory_rows is not None:
            memory_rows = arguments.positive_int(memory_rows, "memory_rows", "Tiered")
        if memory_bytes is not None:
            memory_bytes = arguments.positive_int(memory_bytes, "memory_bytes", "Tiered")
        if not arguments.is_int(cache_bytes) or cache_bytes < 0:
            raise ValueError(f"Tiered: cache_bytes must be an int >= 0, got {cache_bytes!r}")
        self.path = os.fspath(path)
        self.memory_rows = memory_rows
        self.memory_bytes = memory_bytes
        self.cache_bytes = int(cache_bytes)

    def rows_in_memory(self, payload_bytes):
        """The table's budget in rows."""
        if self.memory_rows is not None:
            return self.memory_rows
        return max(1, self.memory_bytes // (payload_bytes + PAYLOAD_BLOCK_OVERHEAD))

    def shares(self, payload_bytes, num_shards):
        """Each shard's storage: the budget split as evenly as whole rows go."""
        rows = self.rows_in_memory(payload_bytes)
        if rows < num_shards:
            raise ValueError(f"Tiered: a memory budget of {rows} rows is fewer than the table's {num_shards} "
                             "shards (one per parameter server); each needs room for a row")
        return [Tiered(self.path, memory_rows=rows // num_shards + (1 if i < rows % num_shards else 0),
                       cache_bytes=self.cache_bytes) for i in range(num_shards)]

    def op_attrs(self, shard_name, payload_bytes):
        return {"tier_memory_rows": self.rows_in_memory(payload_bytes),
                "tier_directory": os.path.join(self.path, shard_name), "tier_cache_bytes": self.cache_bytes}

    def claim_directory(self, owner, table_name):
        """The subdirectory of `path` for the table (or shard) `table_name` that `owner`
        creates: its name, or its name with ".1", ".2", ... while live tables of this
        process hold those, released when `owner` is collected. A job that starts again
        (a restarted cluster) names its tables alike, so each shard opens, and wipes, the
        directory its killed predecessor left instead of leaving it on the disk."""
        with _claims_lock:
            base = os.path.join(self.path, table_name)
            directory, n = base, 0
            while directory in _claimed:
                n += 1
                directory = f"{base}.{n}"
            _claimed.add(directory)
        weakref.finalize(owner, _release, directory)
        return os.path.basename(directory)

    def get_config(self):
        return {"path": self.path, "memory_rows": self.memory_rows, "memory_bytes": self.memory_bytes,
                "cache_bytes": self.cache_bytes}


_claims_lock = threading.Lock()
_claimed = set()  # tier directories of this process's live tables


def _release(directory):
    with _claims_lock:
        _claimed.discard(directory)


KIND = Kind("storage", "storage", Storage, [InMemory, Tiered],
            "tfps.storage.Tiered(path=..., memory_rows=...) or tfps.storage.InMemory()", allows_none=True)
serialize, get = KIND.serialize, KIND.get  # get(None): in memory
