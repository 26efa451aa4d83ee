"""The `none` policy: requests reach the runtime exactly as kubelet sent them."""

from __future__ import annotations

from policies.base import Policy


class NonePolicy(Policy):
    name = "none"
    description = "no resource management: requests pass to the runtime unchanged"
