"""Marketing vs transactional: the campaign preflight keeps the transactional reserve free of
the SES account's MaxSendRate, whatever the number of live campaigns (seed case 3)."""

from __future__ import annotations

import psycopg
import pytest

from flashsend.settings import Settings
from producers.campaign import PreflightFailed, start_campaign
from tests.integration.campaign_helpers import admin, new_campaign


def rate_of(settings: Settings, campaign_id: int) -> float:
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute("SELECT rate_limit FROM campaigns WHERE id = %s", (campaign_id,))
        value = row.fetchone()
    assert value is not None
    return float(value[0])


def test_live_campaigns_share_the_budget_and_never_the_reserve(settings: Settings) -> None:
    s = settings.model_copy(update={"transactional_reserve": 50.0})
    admin(s).set_faults(max_send_rate=1000)  # the account's MaxSendRate
    try:
        first = new_campaign(s, rate=600)
        start_campaign(s, first)
        with pytest.raises(PreflightFailed, match="other live campaigns"):
            start_campaign(s, new_campaign(s, rate=400))  # 600 + 400 > 1000 - 50
        unlimited = new_campaign(s, rate=0)
        start_campaign(s, unlimited)
        assert rate_of(s, unlimited) == 350  # what is left: 1000 - 50 - 600
        with pytest.raises(PreflightFailed, match="taken by other live campaigns"):
            start_campaign(s, new_campaign(s, rate=0))
        shared = s.model_copy(update={"transactional_configuration_set": "marketing"})
        with pytest.raises(PreflightFailed, match="share the configuration set"):
            start_campaign(shared, new_campaign(shared, rate=10))
    finally:
        admin(s).set_faults(max_send_rate=0)
