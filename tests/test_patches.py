"""tfps.keras._patches: every attribute tfps replaces in TensorFlow and tf_keras is installed from
one list, marked, installed once, listed in docs/building.md, and a missing one fails by name."""

import os
import re

import pytest

import tfps
from tfps.keras import _patches as patches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def installed(patch):
    return getattr(patches._resolve(patch.owner), patch.attribute)  # pylint: disable=protected-access


def test_every_patch_is_installed_with_its_marker():
    import tfps.keras_layers.keras3  # noqa: F401  (installs the Keras 3 patches)
    for patch in patches.PATCHES + patches.KERAS3_PATCHES:
        assert getattr(installed(patch), patches.MARKER, None) == patch.name, patch.name


def test_applying_again_changes_nothing():
    import tfps.keras_layers.keras3  # noqa: F401
    every = patches.PATCHES + patches.KERAS3_PATCHES
    before = [installed(patch) for patch in every]
    patches.apply()
    patches.apply_keras3()
    assert [installed(patch) for patch in every] == before


@pytest.mark.parametrize("owner, attribute, message", [
    ("tf_keras.Model", "no_such_method", "the attribute tf_keras.Model.no_such_method is missing"),
    ("tf_keras.no_such_module.Thing", "run", "the owner of tf_keras.no_such_module.Thing.run is missing"),
])
def test_a_missing_attribute_fails_by_name(owner, attribute, message):
    patch = patches.Patch(owner, attribute, lambda original: original, "does what tfps needs")
    with pytest.raises(ImportError, match=re.escape(message)) as raised:
        patches.apply_patch(patch)
    assert "so that it does what tfps needs" in str(raised.value)
    assert "tfps supports TensorFlow 2.16 to 2.21" in str(raised.value)


def test_the_docs_list_every_patch():
    with open(os.path.join(ROOT, "docs", "building.md")) as f:
        readme = " ".join(f.read().split())
    for patch in patches.PATCHES + patches.KERAS3_PATCHES:
        assert f"`{patch.name}`" in readme, patch.name


def test_no_other_module_assigns_to_tensorflow_or_tf_keras():
    # A patch written outside the list would escape its marker, its check and the docs.
    assignment = re.compile(r"^\s*(?:tf|tf_keras|keras|tensorflow)(?:\.\w+)+\s*=(?!=)|"
                            r"setattr\((?:tf|tf_keras|keras|cls|owner|legacy_save)\b", re.M)
    checked = 0
    for top in ("tfps", "keras_layers"):
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(".py") and name != "_patches.py":
                    checked += 1
                    with open(os.path.join(directory, name)) as f:
                        assert not assignment.search(f.read()), os.path.join(directory, name)
    assert checked > 30  # every layer's modules
    assert tfps.keras._patches is patches


def test_autograph_calls_tfps_code_as_it_is_and_still_converts_the_users():
    from tensorflow.python.autograph.core import config
    from tensorflow.python.autograph.impl import conversion

    def users_function(x):
        return x

    patches.apply()
    assert conversion.is_allowlisted(tfps.keras_layers.DynamicEmbedding.call)
    assert conversion.is_allowlisted(tfps.ShardedTable.find)
    assert not conversion.is_allowlisted(users_function)
    assert sum(rule.matches("tfps") for rule in config.CONVERSION_RULES) == 1  # added once
