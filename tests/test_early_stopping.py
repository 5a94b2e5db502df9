"""tfps.callbacks.EarlyStopping(restore_best_weights=True): the model after fit is the model
at the end of the best epoch, tables included (rows, slots and metadata equal to those
recorded then, predictions within 1e-6), locally and under ParameterServerStrategy."""

import json
import os

import pytest
import tf_keras as keras

import tfps
from tests import early_stopping_check
from tests.cluster_run import run_cluster_program

# The best epoch in the middle, training runs on; then a stop by patience.
RUNS_ON = {"scores": [5.0, 3.0, 1.0, 2.0, 4.0], "patience": 10}
STOPS = {"scores": [5.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0], "patience": 2}


def check_restored(result, epochs_run, best):
    assert (result["epochs_run"], result["best_epoch"]) == (epochs_run, best), result
    # Not vacuous: the best epoch's table and predictions differ from the last epoch's.
    assert result["best_differs_from_last"] and result["best_prediction_gap_to_last"] > 1e-3, result
    assert result["rows_per_epoch"][best] < result["rows_per_epoch"][-1], result  # new IDs came later
    assert result["rows_equal_best"], result
    assert result["final_rows"] == result["rows_per_epoch"][best]
    assert result["prediction_gap_to_best"] <= 1e-6, result


def check_not_restored(result):
    assert result["rows_equal_last"] and result["prediction_gap_to_last"] <= 1e-6, result


def test_restores_the_tables_of_the_best_epoch_when_training_runs_on():
    check_restored(early_stopping_check.train(**RUNS_ON, restore_best_weights=True), 5, 2)


def test_restores_the_tables_of_the_best_epoch_when_patience_stops_training():
    check_restored(early_stopping_check.train(**STOPS, restore_best_weights=True), 4, 1)


def test_without_restore_best_weights_the_last_epoch_stays():
    check_not_restored(early_stopping_check.train(**RUNS_ON, restore_best_weights=False))


def test_snapshots_under_a_directory_restore_alike_and_leave_no_files(tmp_path):
    check_restored(early_stopping_check.train(**RUNS_ON, restore_best_weights=True,
                                              snapshot_dir=str(tmp_path / "best")), 5, 2)
    assert os.listdir(tmp_path / "best") == []


def test_the_stock_callback_restores_dense_weights_only_which_this_one_mends():
    # The behaviour the tfps callback exists for: stock EarlyStopping leaves the last
    # epoch's rows under the best epoch's dense layers.
    original = tfps.callbacks.EarlyStopping
    try:
        tfps.callbacks.EarlyStopping = lambda snapshot_dir=None, **kw: keras.callbacks.EarlyStopping(**kw)
        with pytest.warns(UserWarning, match="not the rows of the dynamic tables"):
            result = early_stopping_check.train(**RUNS_ON, restore_best_weights=True)
    finally:
        tfps.callbacks.EarlyStopping = original
    assert result["rows_equal_last"] and not result["rows_equal_best"]
    assert result["prediction_gap_to_best"] > 1e-3


@pytest.mark.parametrize("run", [RUNS_ON, STOPS], ids=["runs_on", "stops"])
def test_the_keras3_callback_restores_the_tables_of_the_best_epoch(run):
    epochs_run, best = (5, 2) if run is RUNS_ON else (4, 1)
    check_restored(early_stopping_check.train(**run, restore_best_weights=True, keras3=True), epochs_run, best)


def test_keras3s_stock_callback_restores_dense_weights_only_which_this_one_mends(monkeypatch):
    import keras as keras3
    from tfps.keras_layers import keras3 as tfps_keras3
    monkeypatch.setattr(tfps_keras3, "EarlyStopping",
                        lambda snapshot_dir=None, **kw: keras3.callbacks.EarlyStopping(**kw))
    result = early_stopping_check.train(**RUNS_ON, restore_best_weights=True, keras3=True)
    assert result["rows_equal_last"] and not result["rows_equal_best"]
    assert result["prediction_gap_to_best"] > 1e-3


def test_restores_the_tables_of_the_best_epoch_under_parameter_server_strategy():
    cases = [dict(RUNS_ON, restore_best_weights=True), dict(STOPS, restore_best_weights=True),
             dict(RUNS_ON, restore_best_weights=False)]
    runs_on, stops, not_restored = run_cluster_program("pss_early_stopping.py", json.dumps(cases))
    check_restored(runs_on, 5, 2)
    check_restored(stops, 4, 1)
    check_not_restored(not_restored)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="snapshot_dir must be a path"):
        tfps.callbacks.EarlyStopping(snapshot_dir=3)
