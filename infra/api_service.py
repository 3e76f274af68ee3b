"""The Campaign HTTP API as a service of the local stack (`flashsend up`): `flashsend api` on
FLASHSEND_API_PORT (loopback), its pid and log under the state dir like the webhook's."""

from __future__ import annotations

from flashsend.settings import Settings
from infra.command_service import CommandService


class ApiService(CommandService):
    command = "api"
    what = "the API"
    health_path = "/healthz"
    port_env = "FLASHSEND_API_PORT"

    def __init__(self, settings: Settings, name: str = "") -> None:
        super().__init__(settings, settings.api_port, name)
