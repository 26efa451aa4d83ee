"""The parts every policy is built from (see docs/policies.md)."""
