"""The table library: a dynamic embedding table over tfps's ops, its shards on the
parameter servers, the objects that configure it (initializers, optimizers, admission and
eviction policies), key hashing, and its checkpoints. Nothing here depends on Keras."""

from tfps.table.dynamic_table import DynamicTable, TableRows
from tfps.table.sharded_table import ShardedTable
