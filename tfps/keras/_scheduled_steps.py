"""Under ParameterServerStrategy, fit schedules steps ahead of the workers: a callback that
reads or writes the tables mid-epoch must first wait for what is scheduled, or it sees the
rows of some earlier step (or half of one)."""


def wait_for_scheduled_steps(model):
    """Returns once every step fit has scheduled so far has run; at once without a cluster."""
    coordinator = getattr(model, "_cluster_coordinator", None)
    if coordinator is not None:
        coordinator.join()
