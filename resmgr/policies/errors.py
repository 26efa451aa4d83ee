"""PolicyError, apart so that the toolkit and the policy interface can both use it."""


class PolicyError(Exception):
    """A request the policy cannot satisfy, or a configuration it cannot accept."""
