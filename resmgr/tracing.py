"""The engine's tracer: spans of lifecycle calls, nothing until OpenTelemetry is started
(--otlp-endpoint, resmgr/telemetry.py), so a daemon without it never imports OpenTelemetry and
pays a function call per span."""

from __future__ import annotations

from typing import Any


class _NoSpan:
    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        pass


_NO_SPAN = _NoSpan()


class Tracer:
    def __init__(self) -> None:
        self.real: Any = None  # OpenTelemetry's tracer, once telemetry is started

    def start_as_current_span(self, name: str, attributes: dict[str, Any] | None = None) -> Any:
        if self.real is None:
            return _NO_SPAN
        return self.real.start_as_current_span(name, attributes=attributes)


tracer = Tracer()


def install(real: Any) -> None:
    """Trace through OpenTelemetry's tracer from now on."""
    tracer.real = real
