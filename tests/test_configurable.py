"""One get() / serialize() for every configurable kind (initializers, optimizers, admission
and eviction policies), and no import cycles among tfps' modules."""

import ast
import os

import pytest

import tfps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KINDS = {
    "initializer": (tfps.initializers, [tfps.initializers.Zeros(), tfps.initializers.RandomUniform(-1, 2),
                                        tfps.initializers.TruncatedNormal(0.5, 0.1)]),
    "optimizer": (tfps.optimizers, [tfps.optimizers.SGD(0.3), tfps.optimizers.Adagrad(0.2),
                                    tfps.optimizers.Adam(0.01), tfps.optimizers.Ftrl(0.1),
                                    tfps.optimizers.RMSprop(0.1, rho=0.8, momentum=0.5)]),
    "admission": (tfps.admission, [tfps.admission.MinCount(3), tfps.admission.Probability(0.25)]),
    "eviction": (tfps.eviction, [tfps.eviction.TTL(steps=7), tfps.eviction.DecayedFrequency(0.9, 0.5),
                                 tfps.eviction.LRU(), tfps.eviction.LFU()]),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_serializes_and_gets_back_an_equal_object(kind):
    module, values = KINDS[kind]
    for value in values:
        again = module.get(module.serialize(value))
        assert type(again) is type(value) and again.get_config() == value.get_config(), value
        assert module.get(value) is value


@pytest.mark.parametrize("kind, name, cls", [
    ("initializer", "zeros", tfps.initializers.Zeros),
    ("initializer", "RandomUniform", tfps.initializers.RandomUniform),
    ("initializer", "truncated_normal", tfps.initializers.TruncatedNormal),
    ("optimizer", "adagrad", tfps.optimizers.Adagrad),
    ("optimizer", "FTRL", tfps.optimizers.Ftrl),
    ("optimizer", "rmsprop", tfps.optimizers.RMSprop),
    ("eviction", "lru", tfps.eviction.LRU),
    ("eviction", "LFU", tfps.eviction.LFU),
])
def test_every_kind_gets_a_class_by_name_in_any_case(kind, name, cls):
    assert type(KINDS[kind][0].get(name)) is cls


def test_none_is_none_of_a_policy_and_refused_for_the_others():
    assert tfps.admission.get(None) is None and tfps.eviction.get(None) is None
    assert tfps.admission.serialize(None) is None
    with pytest.raises(ValueError, match="unknown tfps optimizer None"):
        tfps.optimizers.get(None)


def test_a_class_or_a_keras_object_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match=r"admission= takes an instance, got the class MinCount; use tfps.admission.MinCount\(n\)"):
        tfps.admission.get(tfps.admission.MinCount)
    import tf_keras as keras
    with pytest.raises(ValueError, match=r"is a Keras object, which cannot configure a table's rows .*use tfps.optimizers.SGD"):
        tfps.optimizers.get(keras.optimizers.Adam())
    with pytest.raises(ValueError, match=r"is a Keras object.*use tfps.initializers.Zeros"):
        tfps.initializers.get(keras.initializers.GlorotUniform())


@pytest.mark.parametrize("kind, value, message", [
    ("optimizer", tfps.initializers.Zeros(), "Zeros() is an initializer: pass it as initializer=, not optimizer="),
    ("initializer", tfps.eviction.LRU(), "LRU() is an eviction policy: pass it as eviction=, not initializer="),
    ("admission", tfps.eviction.LRU(), "LRU() is an eviction policy: pass it as eviction=, not admission="),
])
def test_an_object_of_another_kind_is_refused_naming_its_kind(kind, value, message):
    with pytest.raises(ValueError) as raised:
        KINDS[kind][0].get(value)
    assert str(raised.value) == message


def _imports(path, modules):
    """The modules among `modules` that the file imports, at its top or in a function
    (tfps.keras_layers is the keras_layers package)."""
    def known(name):
        return "keras_layers" + name[len("tfps.keras_layers"):] if name.startswith("tfps.keras_layers") else name

    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module:
            # `from package import module` imports the module; `from module import name`, the module.
            for alias in node.names:
                submodule = known(f"{node.module}.{alias.name}")
                found.add(submodule if submodule in modules else known(node.module))
        elif isinstance(node, ast.Import):
            found.update(known(alias.name) for alias in node.names)
    return found & modules


def test_no_module_of_tfps_or_keras_layers_imports_one_that_imports_it_back():
    # Function-local imports count: a cycle hidden inside a function is still a cycle.
    # tfps/__init__ imports every module, so it is left out; the subpackages' are in.
    # Walking the folders (not importing) keeps __pycache__ and the old paths' aliases out.
    files = {}
    for top in ("tfps", "keras_layers"):
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            package = os.path.relpath(directory, ROOT).replace(os.sep, ".")
            for name in names:
                if name.endswith(".py"):
                    module = package + ("" if name == "__init__.py" else "." + name[:-3])
                    files[module] = os.path.join(directory, name)
    del files["tfps"]
    assert {"tfps.table.dynamic_table", "tfps.keras._patches", "tfps.cluster.launch"} <= set(files)
    graph = {module: _imports(path, set(files)) - {module} for module, path in files.items()}
    state, cycles = {}, []

    def visit(module, path):
        state[module] = "open"
        for dependency in sorted(graph[module]):
            if state.get(dependency) == "open":
                cycles.append(path[path.index(dependency):] + [dependency])
            elif dependency not in state:
                visit(dependency, path + [dependency])
        state[module] = "done"
    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert "keras_layers.dynamic_embedding" in graph["keras_layers"] and "tfps.metrics.base" in graph[
        "tfps.metrics.auc"] and not cycles, cycles
