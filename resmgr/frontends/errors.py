"""What a front end answers when the resource manager, not the runtime, refuses a call.

One table for every front end, so a caller sees the same status whichever way it came:

- NotReady (state not reconciled yet, a start waiting for moves): UNAVAILABLE, the status
  gRPC clients retry;
- PolicyError (no room for what the container asks): RESOURCE_EXHAUSTED, as for any other
  resource the node has run out of;
- ControllerError (an annotation naming an RDT or block-I/O class that does not exist):
  INVALID_ARGUMENT, the request itself is wrong;
- HookFailed: the status the hook plugin answered (UNKNOWN if it named none).
"""

from __future__ import annotations

import logging

from resmgr.controllers import ControllerError
from resmgr.engine import NotReady
from resmgr.hooks import HookFailed
from resmgr.policies import PolicyError

CODES = {  # gRPC status code name -> number, as both gRPC and ttrpc carry it
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10,
    "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}

# (error type, status code name, log level: None when it is logged where it was raised)
TABLE: list[tuple[type[Exception], str, int | None]] = [
    (NotReady, "UNAVAILABLE", logging.WARNING),
    (PolicyError, "RESOURCE_EXHAUSTED", logging.ERROR),
    (ControllerError, "INVALID_ARGUMENT", logging.ERROR),
    (HookFailed, "UNKNOWN", None),
]


def refusal(err: BaseException) -> tuple[str, int | None] | None:
    """The status code name to answer err with, and how loudly to log it; None: not one of ours."""
    for kind, code, level in TABLE:
        if isinstance(err, kind):
            if isinstance(err, HookFailed) and err.code in CODES and err.code != "OK":
                code = err.code
            return code, level
    return None
