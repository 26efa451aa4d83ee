"""PolicyError, in the toolkit so that the parts policies are built from and the policy interface can both use it."""


class PolicyError(Exception):
    """A request the policy cannot satisfy, or a configuration it cannot accept."""
