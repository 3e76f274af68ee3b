"""Request bodies: typed, so FastAPI checks them (422 naming the field) and the OpenAPI
document describes them. Each mirrors a command's options."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CampaignCreate(_Body):
    """`flashsend campaign create`, with a registered audience's name instead of SQL."""

    name: str = Field(min_length=1, max_length=200, description="a name for people")
    channel: Literal["email", "sms", "push"] = "email"
    template: str | None = Field(
        default=None, description="SES template (email; default flash_sale)"
    )
    body: str | None = Field(default=None, description="the message of an SMS or push campaign")
    ttl_s: int | None = Field(
        default=None, ge=0, le=2_419_200, description="push: how long a notification may wait"
    )
    collapse_key: str | None = Field(
        default=None, max_length=64, description="push: a newer notification replaces older"
    )
    from_address: str | None = None
    configuration_set: str | None = None
    rate: float | None = Field(default=None, ge=0, description="recipients/s; 0 = unlimited")
    rate_unit: Literal["messages", "segments"] = "messages"
    ramp: str | None = Field(default=None, description='rate steps, e.g. "0:200,10m:600,30m:1200"')
    audience: str | None = Field(
        default=None,
        description="a named audience (flashsend audience add); default: active, opted in",
    )
    variants: list[str] = Field(
        default_factory=list, description="A/B test variants NAME=TEMPLATE[:PERCENT]"
    )
    holdout_wait: str = "2h"
    winner_by: Literal["clicks", "opens", "manual"] = "clicks"
    local_window: str | None = Field(
        default=None, description="HH:MM-HH:MM in each recipient's zone"
    )
    date: str | None = Field(default=None, description="YYYY-MM-DD of local_window")
    waves: str | None = Field(default=None, description="TIER:DURATION,… e.g. recent:30m,rest:2d")
    correction_of: int | None = None


class CampaignStart(_Body):
    """`flashsend campaign start`."""

    seed_list: list[str] | None = Field(
        default=None, max_length=1000, description="addresses that get the mail first"
    )
    hold: str | None = Field(
        default=None, description="how long the audience waits (with seed_list)"
    )
    ignore_quota: bool = False
    spread_over_quota: bool = False


class CampaignControl(_Body):
    """`flashsend campaign pause|resume|cancel`."""

    reason: str | None = Field(default=None, max_length=500)


class CampaignPromote(_Body):
    variant: str = Field(min_length=1)


class CampaignRelease(_Body):
    by: str | None = Field(default=None, max_length=200)


class ResendUnknown(_Body):
    """`flashsend campaign resend-unknown`: a dry run unless `apply` names one."""

    older_than: str = Field(description="the grace, e.g. 1h")
    apply: str | None = Field(
        default=None, description="the plan id a dry run answered: queue exactly that plan again"
    )
    reason: str = "resend-unknown through the API"


class AudienceAdd(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    where: str = Field(min_length=1, description="SQL condition over users u")


class TemplatePut(_Body):
    """`flashsend template put`: {{var}} placeholders."""

    subject: str = Field(min_length=1, max_length=998)
    html: str = Field(min_length=1)
    text: str = Field(min_length=1)


class PromoGenerate(_Body):
    """`flashsend promo generate`."""

    count: int = Field(ge=1, le=10_000_000)
    pattern: str = "{10}"


class PromoImport(_Body):
    """`flashsend promo import`: the file's lines."""

    codes: list[str] = Field(min_length=1, max_length=1_000_000)


class SuppressionChange(_Body):
    """Add or remove an address, with the reason recorded in the audit log."""

    address: str = Field(min_length=3, max_length=320)
    reason: str = Field(min_length=1, max_length=500)
