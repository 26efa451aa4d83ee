"""The parts every policy is built from (see docs/writing-a-policy.md)."""
