"""The `none` policy: requests reach the runtime exactly as kubelet sent them.

Containers still get their RDT and block-I/O class names (annotation, else the QoS
class), so the class controllers work under every policy.
"""

from __future__ import annotations

from resmgr.model import Container, Pod
from resmgr.policies.base import Decision, Policy, View, class_names


class NonePolicy(Policy):
    name = "none"
    pins = False
    description = "no resource management: requests pass to the runtime unchanged"

    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        classes = class_names(container, pod)
        return Decision(classes=classes)
