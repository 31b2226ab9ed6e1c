"""grpc.health.v1 per port: each port answers only for "" and its own services (others: NOT_FOUND),
so a probe naming a service never routes to the wrong port.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpc_health.v1 import health


class PortHealth:
    """The health servicers of a daemon's ports (label -> service names), set and drained together."""

    def __init__(self, services_by_port: Mapping[str, Sequence[str]]) -> None:
        self._servicers: dict[str, Any] = {}
        self._port_of: dict[str, str] = {}
        for port, services in services_by_port.items():
            self._servicers[port] = health.aio.HealthServicer()
            for service in services:
                if service in self._port_of:
                    raise ValueError(f"service {service!r} is listed for two ports; give each port its own")
                self._port_of[service] = port

    def servicer(self, port: str) -> Any:
        """The health servicer to register on the server of `port`."""
        return self._servicers[port]

    async def set(self, service: str, status: int) -> None:
        """Set `service`'s status on the port that serves it; "" sets every port's overall status."""
        if service == "":
            for servicer in self._servicers.values():
                await servicer.set("", status)
            return
        port = self._port_of.get(service)
        if port is None:
            raise ValueError(f"no port serves {service!r}; known: {sorted(self._port_of)}")
        await self._servicers[port].set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        """Turn every service on every port NOT_SERVING for good (the drain's first step)."""
        for servicer in self._servicers.values():
            await servicer.enter_graceful_shutdown()
