"""Everything importing tfps changes in TensorFlow and tf_keras, in one list, and what
importing its Keras 3 layer changes in Keras 3, in a second.

Each Patch replaces one attribute with a wrapper made from the original by a function of
the module that owns the behaviour, and says why; docs/building.md's "What importing tfps
changes" lists the same entries. `apply()` installs every patch once: each wrapper carries one
marker (MARKER, the patch's name), so applying again changes nothing. KERAS3_PATCHES are
installed by `apply_keras3()` when tfps.keras_layers.keras3 is imported, so a process that
never uses Keras 3 keeps it as it is. An owner or attribute that this TensorFlow, tf_keras
or Keras lacks fails the import with an ImportError that
names it, rather than a model that trains without its tables' updates. Besides the
patches, two registrations go through TensorFlow's public hooks: the checkpoint saver of
tables, and the conversion that refuses to densify a table's gradient; a third adds tfps to
autograph's list of libraries it does not convert.
"""

import dataclasses
import functools
import importlib

import tensorflow as tf

from tfps.keras import _accumulation as accumulation
from tfps.table import checkpoint
from tfps.keras import _exact_evaluation as exact_evaluation
from tfps.keras import _incremental_backup as incremental_backup
from tfps.keras import _keras3_bridge as keras3_bridge
from tfps.keras import _keras3_patches as keras3_patches
from tfps.keras import _saving as keras_saving
from tfps.keras import _step_metrics as step_metrics
from tfps.keras import _optimizer_bridge as optimizer_bridge
from tfps.keras import _synchronous_training as synchronous_training
from tfps.keras import _worker_cache_flush as worker_cache_flush
from tfps.keras import _xla as xla

MARKER = "__tfps_patch__"
SUPPORTED = ("TensorFlow 2.16 to 2.21 with the tf_keras of the same minor version (and, for "
             "tfps.keras_layers.keras3, Keras 3.15)")


@dataclasses.dataclass(frozen=True)
class Patch:
    owner: str  # a module or class, by import path
    attribute: str
    wrap: object  # original (None where the owner has no such attribute yet) -> replacement
    why: str
    adds: bool = False  # the owner has no such attribute before: tfps adds it

    @property
    def name(self):
        return f"{self.owner}.{self.attribute}"


PATCHES = (
    Patch("tf_keras.src.optimizers.optimizer.Optimizer", "_distributed_apply_gradients_fn",
          functools.partial(optimizer_bridge.bridged, unique=True,
                            check=optimizer_bridge.check_current_optimizer),
          "sends a DynamicEmbedding's gradient to its table's optimizer inside the Keras "
          "optimizer's apply (current optimizers)"),
    Patch("tf_keras.src.optimizers.optimizer.Optimizer", "_deduplicate_sparse_grad",
          optimizer_bridge.deduplicating,
          "sums a table's gradient per key in one pass, over its lookup's distinct keys, so "
          "the update reuses the lookup's routing to the parameter servers (current optimizers)"),
    Patch("tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2", "_distributed_apply",
          functools.partial(optimizer_bridge.bridged, unique=False),
          "the same for the legacy optimizers"),
    Patch("tensorflow.compat.v1.train.Optimizer", "apply_gradients", optimizer_bridge.refusing,
          "a TF1 optimizer refuses a table's gradient, naming the optimizers that carry it"),
    Patch("tf_keras.src.saving.legacy.save", "save_model",
          functools.partial(keras_saving.refusing_hdf5, what="a model saved"),
          "an HDF5 model file cannot hold a table's rows: refuse before writing"),
    Patch("tf_keras.src.saving.legacy.save", "save_weights",
          functools.partial(keras_saving.refusing_hdf5, what="weights saved"),
          "the same for HDF5 weights"),
    Patch("tf_keras.Model", "get_weights",
          functools.partial(keras_saving.warning_dense_only, what="returns"),
          "warns that the tables' rows are not among the weights"),
    Patch("tf_keras.Model", "set_weights",
          functools.partial(keras_saving.warning_dense_only, what="sets"),
          "the same for set_weights"),
    Patch("tf_keras.Model", "fit",
          lambda fit: synchronous_training.taking_back_after_fit(
              exact_evaluation.refusing_validation_steps(worker_cache_flush.flushing_worker_caches(fit))),
          "pushes the worker caches of a model's tables before each epoch's validation and end, "
          "refuses validation_steps with exact evaluation under ParameterServerStrategy, and "
          "puts fit's own train function back after a fit with SynchronousTraining, however it ends"),
    Patch("tf_keras.callbacks.BackupAndRestore", "on_train_begin",
          incremental_backup.refusing_step_backups_under_pss,
          "BackupAndRestore(save_freq=N), which tf_keras never runs under "
          "ParameterServerStrategy, is refused for a model with tables, naming IncrementalBackup"),
    Patch("tf_keras.Model", "train_step", step_metrics.table_train_step,
          "a model with tables updates its metrics after the step's finiteness check, and one "
          "whose tables skip non-finite steps leaves a skipped step out of its loss trackers "
          "and compiled metrics as well"),
    Patch("tf_keras.Model", "compile", xla.falling_back_from_xla,
          "jit_compile=True falls back to False for a model with tables, whose ops XLA cannot "
          "compile, as Keras 3 does"),
    Patch("tf_keras.Model", "summary", keras_saving.with_table_lines,
          "lists each table's dim, rows and shards, which the parameter counts leave out"),
    Patch("tf_keras.Model", "_make_test_function_exact", exact_evaluation.building_metrics_first,
          "builds compiled metrics before exact evaluation (pss_evaluation_shards) clones them"),
    Patch("tf_keras.Model", "_aggregate_exact_metrics", exact_evaluation.with_python_numbers,
          "exact evaluation's results are Python numbers, as every other evaluation's are, "
          "where tf_keras returns tensors to evaluate's caller and the callbacks' on_test_end"),
    Patch("tf_keras.Model", "evaluate", exact_evaluation.refusing_steps,
          "refuses steps with exact evaluation under ParameterServerStrategy, which ignores them "
          "and never ends over repeating data, and a dataset without steps without it"),
    Patch("tensorflow.IndexedSlices", "__add__", accumulation.refusing_table_gradient_add,
          "`+` on a table's gradient fails naming tfps.GradientAccumulator", adds=True),
    Patch("tensorflow.python.checkpoint.checkpoint_management", "_delete_file_if_exists",
          checkpoint.deleting_table_files,
          "CheckpointManager's deletion of old checkpoints takes their table files too"),
    Patch("tensorflow.python.checkpoint.functional_saver.MultiDeviceSaver", "__init__",
          checkpoint.recording_tables, "a checkpoint's saver keeps the tables it restores"),
    Patch("tensorflow.python.checkpoint.checkpoint._CheckpointRestoreCoordinator", "restore_saveables",
          checkpoint.checking_tables_before_any_restore,
          "a restore checks every table's files before TensorFlow restores anything else, and a "
          "refused one restores nothing into objects made later, so the whole model stays as it was"),
    Patch("tensorflow.python.checkpoint.functional_saver.MultiDeviceSaver", "restore",
          checkpoint.checking_tables_first,
          "the same check for restores that make a saver themselves (a SavedModel's load)"),
)

KERAS3_PATCHES = (
    Patch("keras.src.optimizers.base_optimizer.BaseOptimizer", "apply", keras3_bridge.bridged_apply,
          "sends a Keras 3 DynamicEmbedding's gradient to its table inside the Keras 3 "
          "optimizer's apply, as a stock Embedding's gradient over the step's distinct keys"),
    Patch("keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer", "apply",
          keras3_bridge.bridged_apply, "the same where a loss-scale optimizer's apply starts"),
    Patch("keras.src.backend.tensorflow.optimizer.TFOptimizer", "_backend_update_step",
          keras3_bridge.bridged_update_step,
          "applies each key's sum to its table after unscaling, clipping and the finiteness check"),
    Patch("keras.src.backend.tensorflow.trainer.TensorFlowTrainer", "train_step",
          step_metrics.keras3_table_train_step,
          "the same in Keras 3: metrics after the finiteness check, and a skipped step left "
          "out of the loss tracker and compiled metrics"),
    Patch("keras.src.backend.tensorflow.export.TFExportArchive", "_backend_track_layer",
          keras3_patches.tracking_tables, "model.export() keeps the tables' rows"),
    Patch("keras.Model", "export", keras3_patches.refusing_padded_ids,
          "refuses an export whose dense signature would feed a table padded ragged or sparse IDs"),
    Patch("keras.src.legacy.saving.legacy_h5_format", "save_model_to_hdf5",
          functools.partial(keras_saving.refusing_hdf5, what="a model saved", always=True, keras="keras3"),
          "an HDF5 model file cannot hold a table's rows: refuse before writing"),
    Patch("keras.Model", "get_weights", functools.partial(keras_saving.warning_dense_only, what="returns"),
          "warns that the tables' rows are not among the weights"),
    Patch("keras.Model", "set_weights", functools.partial(keras_saving.warning_dense_only, what="sets"),
          "the same for set_weights"),
)


def _resolve(path):
    """The module or class at an import path (a module, then attributes down from it)."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            owner = getattr(owner, part)
        return owner
    raise ImportError(path)


def _missing(patch, what):
    import tf_keras
    keras3 = f" / Keras {importlib.import_module('keras').__version__}" if patch.owner.startswith("keras.") else ""
    return ImportError(
        f"tfps: {what} {patch.name} is missing from TensorFlow {tf.__version__} / tf_keras "
        f"{getattr(tf_keras, '__version__', '?')}{keras3}; tfps replaces it so that it {patch.why}. "
        f"tfps supports {SUPPORTED}.")


def apply_patch(patch):
    try:
        owner = _resolve(patch.owner)
    except (ImportError, AttributeError):
        raise _missing(patch, "the owner of") from None
    original = owner.__dict__.get(patch.attribute) if patch.adds else getattr(owner, patch.attribute, None)
    if original is None and not patch.adds:
        raise _missing(patch, "the attribute")
    if getattr(original, MARKER, None) == patch.name:
        return
    replacement = patch.wrap(original)
    setattr(replacement, MARKER, patch.name)
    setattr(owner, patch.attribute, replacement)


_registered = []


def _convert_no_tfps_code():
    """Adds tfps to autograph's libraries that it calls as they are (TensorFlow's list,
    which holds keras and tf_keras): tfps's code is graph code already, and converting it
    would cost CPU in every process that builds a model with a table."""
    from tensorflow.python.autograph.core import config

    rule = config.DoNotConvert("tfps")
    if not any(isinstance(r, config.DoNotConvert) and r.matches("tfps") for r in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (rule,) + tuple(config.CONVERSION_RULES)


def apply():
    """Installs every patch and registration (idempotent)."""
    for patch in PATCHES:
        apply_patch(patch)
    if not _registered:
        checkpoint.register_saver()
        tf.register_tensor_conversion_function(tf.IndexedSlices, accumulation.refuse_densifying,
                                               priority=99)
        _convert_no_tfps_code()
        _registered.append(True)


def apply_keras3():
    """Installs the Keras 3 patches (idempotent); tfps.keras_layers.keras3 calls it."""
    for patch in KERAS3_PATCHES:
        apply_patch(patch)
