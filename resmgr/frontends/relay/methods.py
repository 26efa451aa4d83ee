"""What the relay knows about CRI methods, read from the generated descriptors."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import message_factory
from google.protobuf.message import Message

from resmgr.generated.cri import api_pb2


@dataclass(frozen=True)
class MethodInfo:
    path: str  # /runtime.v1.RuntimeService/Version
    name: str  # Version
    request: type[Message]
    response: type[Message]
    server_streaming: bool
    client_streaming: bool
    image_service: bool


def _load() -> dict[str, MethodInfo]:
    table = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            path = f"/{service.full_name}/{m.name}"
            table[path] = MethodInfo(
                path=path, name=m.name,
                request=message_factory.GetMessageClass(m.input_type),
                response=message_factory.GetMessageClass(m.output_type),
                server_streaming=m.server_streaming, client_streaming=m.client_streaming,
                image_service=service.name == "ImageService",
            )
    return table


KNOWN: dict[str, MethodInfo] = _load()


def short_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def method_label(path: str) -> str:
    """A metric label for a call: the method's name, "unknown" for a path not in the schema
    (a client's made-up paths must not grow the metrics without bound)."""
    return short_name(path) if path in KNOWN else "unknown"


def is_image_method(path: str) -> bool:
    info = KNOWN.get(path)
    if info is not None:
        return info.image_service
    # Unknown method: route by service name, so a newer ImageService still reaches images.
    return path.split("/")[1].endswith(".ImageService") if path.count("/") >= 2 else False
