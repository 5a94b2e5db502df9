"""Serializing and resolving the table policies (tfps.admission, tfps.eviction) by class."""


def serialize(policy):
    return None if policy is None else {"class_name": type(policy).__name__,
                                        "config": policy.get_config()}


def resolve(identifier, base, by_name, kind, other_base, other_kind, hint):
    """A `base` policy from an instance, a `serialize` dict, or None; a policy of the other
    kind, or anything else, is refused with an error that says which it is."""
    if identifier is None or isinstance(identifier, base):
        return identifier
    if isinstance(identifier, dict) and identifier.get("class_name") in by_name:
        return by_name[identifier["class_name"]].from_config(identifier["config"])
    if isinstance(identifier, other_base):
        raise ValueError(f"{identifier!r} is an {other_kind} policy: pass it as {other_kind}=, not {kind}=")
    raise ValueError(f"unknown tfps {kind} policy {identifier!r}; use {hint}")
