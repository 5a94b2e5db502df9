"""ExportForServing: a callback that keeps a serving model base path fresh while a model
trains, with exports of changes between whole exports."""

import os
import shutil
import time

import tf_keras as keras

from tfps import _arguments as arguments
from tfps.keras import _keras3_guard as keras3_guard
from tfps.keras import _scheduled_steps as scheduled_steps
from tfps.keras import _serving_rows as serving_rows


def versions_in(base_dir):
    """The numbered versions under a model base path, oldest first."""
    if not os.path.isdir(base_dir):
        return []
    return sorted(int(name) for name in os.listdir(base_dir) if name.isdigit())


class ExportForServing(keras.callbacks.Callback):
    """Exports the model being trained into `base_dir/<version>` every `every_seconds`, where
    TensorFlow Serving (or any loader of the newest version of a model base path) picks it
    up. Versions are increasing integers (milliseconds since the epoch). The first export,
    `every_seconds` after training begins, is whole; each after it holds the rows changed
    since the one before (`tfps.export.save_for_serving(..., changes_since=...)`), so it
    costs the rows that changed. Each version is a complete stock SavedModel. When
    training ends a last version holds what changed since the one before (nothing is
    written if no step ran since).

    The clock is checked where fit hands control back: every `steps_per_execution` steps.
    Under ParameterServerStrategy, where fit only queues steps for the workers, an export
    first waits for the steps queued before it, so each version holds every step fit ran
    before it and none half-applied.

    Args:
      base_dir: the model base path; created if missing.
      every_seconds: seconds between exports (> 0).
      max_change_layers, max_layered_rows, min_count, value_dtype, signatures: as for
        save_for_serving (min_count and value_dtype are fixed by the first, whole, export).
      keep_versions: after each export, delete all but this many newest numbered versions
        under base_dir, whoever wrote them (None: keep all). Later versions keep the rows
        they reuse (hard links), so deleting an older version never breaks a newer one.
      whole_at_end: when training ends, write a last version whole (else of changes).
    """

    def __init__(self, base_dir, every_seconds=60, max_change_layers=8, max_layered_rows=1.25, min_count=None,
                 value_dtype=None, signatures=None, keep_versions=None, whole_at_end=False):
        super().__init__()
        base_dir = arguments.path(base_dir, "base_dir", "ExportForServing")
        if not arguments.is_number(every_seconds) or not every_seconds > 0:
            raise ValueError(f"ExportForServing: every_seconds must be a number > 0, got {every_seconds!r}")
        self.base_dir = os.path.abspath(base_dir)
        self.every_seconds = float(every_seconds)
        self.max_change_layers = arguments.positive_int(max_change_layers, "max_change_layers", "ExportForServing")
        self.max_layered_rows = arguments.number_at_least(max_layered_rows, 1, "max_layered_rows",
                                                          "ExportForServing")
        if min_count is not None:
            min_count = arguments.positive_int(min_count, "min_count", "ExportForServing")
        if value_dtype is not None:
            serving_rows.value_dtype_of(value_dtype, "ExportForServing")
        self.min_count, self.value_dtype, self.signatures = min_count, value_dtype, signatures
        self.keep_versions = (None if keep_versions is None else
                              arguments.positive_int(keep_versions, "keep_versions", "ExportForServing"))
        self.whole_at_end = bool(whole_at_end)
        self.exports = []  # the reports of this callback's exports, in order
        self._last_export = None
        self._blocks_since_export = 0
        self._supports_tf_logs = True  # its batch hook must not wait for the steps' logs

    def set_model(self, model):
        keras3_guard.refuse_keras3("tfps.callbacks.ExportForServing", [model])
        super().set_model(model)

    def export(self, whole=False):
        """Writes the next version now; returns save_for_serving's report with "version"."""
        from tfps.keras.export import save_for_serving
        scheduled_steps.wait_for_scheduled_steps(self.model)  # a version holds every step before it
        version = max([int(time.time() * 1000)] + [v + 1 for v in versions_in(self.base_dir)])
        previous = None if whole or not self.exports else self.exports[-1]["export_dir"]
        if previous is not None and not os.path.isdir(previous):
            previous = None  # deleted by hand: start again with a whole export
        report = save_for_serving(
            self.model, os.path.join(self.base_dir, str(version)), changes_since=previous,
            max_change_layers=self.max_change_layers, max_layered_rows=self.max_layered_rows,
            signatures=self.signatures,
            **({} if previous else {"min_count": self.min_count, "value_dtype": self.value_dtype}))
        report["version"] = version
        self.exports.append(report)
        self._last_export = time.monotonic()
        self._blocks_since_export = 0
        if self.keep_versions is not None:
            for old in versions_in(self.base_dir)[:-self.keep_versions]:
                shutil.rmtree(os.path.join(self.base_dir, str(old)), ignore_errors=True)
        return report

    def on_train_begin(self, logs=None):
        if self._last_export is None:
            self._last_export = time.monotonic()  # a first version of a barely trained model serves no one

    def on_train_batch_end(self, batch, logs=None):
        self._blocks_since_export += 1
        if time.monotonic() - self._last_export >= self.every_seconds:
            self.export()

    def on_train_end(self, logs=None):
        # A version with no step since would repeat the last.
        if self.whole_at_end or self._blocks_since_export or not self.exports:
            self.export(whole=self.whole_at_end)
