"""The providers' boto3 clients (SES, SMS, SNS push), built one way: the SDK never retries (a
call without an answer may have been sent: the caller decides), timeouts are bounded, and the
local stand-in gets its own keys."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from flashsend.settings import Settings


def provider_client(settings: Settings, service: str, *, timeout_s: float, pool: int) -> Any:
    """A thread-safe client of `service`; `pool` connections for the calls in flight."""
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        parameter_validation=False,
        connect_timeout=min(5.0, timeout_s),
        read_timeout=timeout_s,
        max_pool_connections=pool,
        tcp_keepalive=True,
    )
    local = bool(settings.ses_endpoint_url)
    return boto3.session.Session().client(
        service,
        endpoint_url=settings.ses_endpoint_url,
        region_name=settings.ses_region,
        aws_access_key_id=settings.ses_access_key_id if local else None,
        aws_secret_access_key=(
            settings.ses_secret_access_key.get_secret_value() if local else None
        ),
        config=config,
    )
