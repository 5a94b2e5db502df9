"""The base of the small value objects a table is configured with (initializers, admission
and eviction policies): built again from their get_config(), equal when of one class and
config, and shown as the constructor call that makes them."""


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
