"""The C++ registries (TFPS_OPTIMIZERS in custom_ops/core/optimizer.h, TFPS_EVICTION_POLICIES
in custom_ops/core/policies.h) and their Python classes describe the same things, in the same
order (checkpoints record an optimizer's index); and each registered optimizer builds a table
whose slots and hyperparameters the op reports back."""

import os
import re

import numpy as np
import pytest

import tfps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def registry_rows(header, macro):
    """The X(...) rows of `#define macro(X)` in custom_ops/core/`header`, as lists of fields."""
    with open(os.path.join(ROOT, "custom_ops", "core", header)) as f:
        text = f.read()
    body = re.search(rf"#define {macro}\(X\)(.*?)\n\n", text, re.S).group(1)
    rows = re.findall(r"X\(([^)]*)\)", body)
    return [[field.strip() for field in re.findall(r'\s*("[^"]*"|[^,]+)', row)] for row in rows]


def test_python_optimizers_mirror_the_cpp_registry_in_order():
    rows = registry_rows("optimizer.h", "TFPS_OPTIMIZERS")
    assert len(rows) >= 5
    assert [row[1].strip('"') for row in rows] == [c.op_name for c in tfps.optimizers.OPTIMIZERS]
    params = {p[0] for p in registry_rows("optimizer.h", "TFPS_OPTIMIZER_PARAMS")}
    for (_, name, slots, _, names), cls in zip(rows, tfps.optimizers.OPTIMIZERS):
        expected = [n for n in names.strip('"').split(",") if n]
        assert set(expected) <= params, name
        assert int(slots) == cls.num_slots, name
        assert list(cls().op_params()) == expected, name  # by name, in the registry's order


@pytest.mark.parametrize("cls", tfps.optimizers.OPTIMIZERS, ids=lambda c: c.op_name)
def test_every_registered_optimizer_builds_a_table_with_its_slots(cls):
    table = tfps.DynamicTable(3, optimizer=cls(0.1))
    before = table.find_or_insert([7, 8]).numpy()
    table.apply_gradients([7, 8], np.ones((2, 3), np.float32))
    rows = table.export()
    assert rows.slots.shape == (2, cls.num_slots, 3)
    assert np.abs(table.find([7, 8]).numpy() - before).min() > 1e-3  # every coordinate moved


@pytest.mark.parametrize("macro, module", [("TFPS_EVICTION_POLICIES", tfps.eviction),
                                           ("TFPS_ADMISSION_POLICIES", tfps.admission)])
def test_python_policies_mirror_the_cpp_registries(macro, module):
    names = [row[1].strip('"') for row in registry_rows("policies.h", macro)]
    assert names == ["none"] + [cls.op_name for cls in module.POLICIES]  # None: "none"
