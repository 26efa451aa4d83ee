"""Follow the runtime's container events, so an exited container gives its CPUs back at once.

containerd 1.7+ serves the CRI GetContainerEvents stream. A STOPPED event releases what the
container holds, DELETED forgets it, and a container created by someone else starts a
reconciliation round. Events can be missed (the runtime drops a slow subscriber, or is
restarted), so every time the stream ends a round is run; runtimes without the stream
(UNIMPLEMENTED) are left to the periodic reconciliation alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from resmgr.engine.state import brief
from resmgr.frontends.cri.convert import EVENTS

if TYPE_CHECKING:
    from resmgr.engine import Engine
    from resmgr.frontends.cri.runtime import RuntimeClient

log = logging.getLogger("cri-resmgr.engine")

RETRY_MIN, RETRY_MAX = 0.05, 1.0  # seconds between attempts to subscribe again


async def follow(engine: Engine, runtime: RuntimeClient) -> None:
    """Feed container events to the engine until the runtime says it has none."""
    delay = RETRY_MIN
    while True:
        call = runtime.container_events()
        started, following = time.monotonic(), False
        try:
            async for event in call:
                if not following:
                    log.info("following the runtime's container events")
                    following = True
                kind = EVENTS.get(event.container_event_type)
                if kind is not None:
                    await engine.stopping.container_event(kind, event.container_id, event.pod_sandbox_status.id)
            if following:
                log.warning("the runtime ended its container event stream; reconciling and subscribing again")
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("the runtime serves no container events; exits are found by periodic reconciliation")
                return
            if following:
                log.warning("container event stream ended (%s); reconciling and subscribing again", brief(err))
        except Exception:  # a bug in handling one event must not stop following them
            log.exception("handling a container event failed; reconciling and subscribing again")
        finally:
            call.cancel()
        if following:
            engine.state.wake()  # whatever happened while we were not subscribed
        # A stream that lasted is a fresh start; one that keeps ending at once backs off.
        delay = RETRY_MIN if time.monotonic() - started > RETRY_MAX else min(delay * 2, RETRY_MAX)
        await asyncio.sleep(delay)
