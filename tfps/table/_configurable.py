"""The small value objects a table is configured with (initializers, optimizers, admission
and eviction policies), and the one way each kind is looked up and serialized.

Configurable: built again from its get_config(), equal when of one class and config, and
shown as the constructor call that makes it. Kind: one configurable kind's classes, with
`get` (an instance, a name such as "adagrad" or "lru", a `serialize` dict, or None where the
kind allows it) and `serialize`. Kinds know each other through this module, so a policy
given where another kind is expected is refused by name without the modules importing
each other."""

import re

_KINDS = []


class Configurable:
    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def _snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Kind:
    """One configurable kind: `name` as messages say it ("eviction policy"), `argument` the
    keyword it is passed as, `base` its base class, `classes` those get() builds by name
    (class name in any case or snake_case, and `aliases`), `allows_none` whether None
    stands for "none of it", `hint` how to make one."""

    def __init__(self, name, argument, base, classes, hint, aliases=None, allows_none=False):
        self.name, self.argument, self.base, self.hint = name, argument, base, hint
        self.allows_none = allows_none
        self._by_name = {}
        for cls in classes:
            self._by_name[cls.__name__.lower()] = cls
            self._by_name[_snake(cls.__name__)] = cls
        self._by_name.update({alias.lower(): cls for alias, cls in (aliases or {}).items()})
        _KINDS.append(self)

    def serialize(self, value):
        """{"class_name", "config"}, which get() builds again; None for None."""
        return None if value is None else {"class_name": type(value).__name__, "config": value.get_config()}

    def get(self, identifier):
        if identifier is None and self.allows_none or isinstance(identifier, self.base):
            return identifier
        if isinstance(identifier, str) and identifier.lower() in self._by_name:
            cls = self._by_name[identifier.lower()]
            try:
                return cls()
            except (TypeError, ValueError):
                raise ValueError(f"tfps {self.name} {identifier!r} needs arguments; use {self.hint}") from None
        if isinstance(identifier, dict) and str(identifier.get("class_name", "")).lower() in self._by_name:
            return self._by_name[identifier["class_name"].lower()].from_config(identifier.get("config", {}))
        if isinstance(identifier, type) and issubclass(identifier, self.base):
            raise ValueError(f"{self.argument}= takes an instance, got the class {identifier.__name__}; "
                             f"use {self.hint}")
        if type(identifier).__module__.split(".")[0] in ("tf_keras", "keras"):
            raise ValueError(f"{identifier!r} is a Keras object, which cannot configure a table's rows "
                             f"(they are updated on the parameter servers); use {self.hint}")
        for other in _KINDS:
            if other is not self and isinstance(identifier, other.base):
                article = "an" if other.name[0] in "aeiou" else "a"
                raise ValueError(f"{identifier!r} is {article} {other.name}: pass it as "
                                 f"{other.argument}=, not {self.argument}=")
        raise ValueError(f"unknown tfps {self.name} {identifier!r}; use {self.hint}")
