"""Templates, promo pools and dead letters through the API, against the real stand-in,
PostgreSQL and Kafka."""

from __future__ import annotations

import uuid

from flashsend.settings import Settings
from tests.integration.api_helpers import assert_problem, audit_rows, serve
from tests.integration.campaign_helpers import new_campaign


def test_templates_put_get_list(settings: Settings) -> None:
    name = f"api_{uuid.uuid4().hex[:8]}"
    body = {"subject": "Hi {{first_name}}", "html": "<p>sale</p>", "text": "sale"}
    with serve(settings) as api:
        with api.client("operator") as operator:
            assert_problem(operator.put(f"/api/v1/templates/{name}", json=body), 403)
            assert_problem(operator.get(f"/api/v1/templates/{name}"), 404)
        with api.client("admin") as admin:
            assert admin.put(f"/api/v1/templates/{name}", json=body).status_code == 200
            got = admin.get(f"/api/v1/templates/{name}").json()
            assert got == {"name": name, **body}
            names = [t["name"] for t in admin.get("/api/v1/templates").json()["items"]]
            assert name in names
            bad = assert_problem(admin.put("/api/v1/templates/bad name!", json=body), 422)
            assert bad["errors"][0]["field"] == "path.name"
            missing = assert_problem(
                admin.put(f"/api/v1/templates/{name}", json={"subject": "s"}), 422
            )
            assert {e["field"] for e in missing["errors"]} == {"body.html", "body.text"}
    assert [r["detail"] for r in audit_rows(settings) if r["action"] == "template put"] == [
        {"name": name}
    ]


def test_promo_pool_generate_import_and_counts(settings: Settings) -> None:
    cid = new_campaign(settings)
    with serve(settings) as api, api.client("admin") as admin:
        assert_problem(admin.get(f"/api/v1/campaigns/{cid}/promo-codes"), 404)
        made = admin.post(
            f"/api/v1/campaigns/{cid}/promo-codes/generate", json={"count": 50, "pattern": "{8}"}
        )
        assert made.status_code == 200, made.text
        assert made.json()["added"] == 50
        dense = admin.post(
            f"/api/v1/campaigns/{cid}/promo-codes/generate", json={"count": 50, "pattern": "{1}"}
        )
        assert assert_problem(dense, 422)["errors"][0]["field"] == "body.pattern"
        imported = admin.post(
            f"/api/v1/campaigns/{cid}/promo-codes/import", json={"codes": ["A-1", "A-2"]}
        )
        assert imported.json()["added"] == 2
        again = admin.post(
            f"/api/v1/campaigns/{cid}/promo-codes/import", json={"codes": ["A-2", "A-3"]}
        )
        assert_problem(again, 422)  # A-2 is in the pool: nothing imported
        counts = admin.get(f"/api/v1/campaigns/{cid}/promo-codes").json()
        assert counts["promo_codes_left"] == 52 and counts["promo_codes_issued"] == 0
    actions = [r["action"] for r in audit_rows(settings, cid)]
    assert actions == ["promo generate", "promo import"]


def test_dead_letters_are_admin_only_and_listed(settings: Settings) -> None:
    with serve(settings) as api:
        with api.client("operator") as operator:
            assert_problem(operator.get("/api/v1/dead-letters"), 403)
        with api.client("admin") as admin:
            listed = admin.get("/api/v1/dead-letters")
            assert listed.status_code == 200 and listed.json() == {"items": []}
            assert_problem(admin.get("/api/v1/dead-letters/0:5"), 404)
            assert_problem(admin.get("/api/v1/dead-letters/x"), 422)


def test_suppressions_add_search_remove_with_reasons(settings: Settings) -> None:
    with serve(settings) as api:
        with api.client("operator") as operator:
            assert_problem(operator.get("/api/v1/suppressions"), 403)
        with api.client("admin") as admin:
            change = {"address": "  Someone@Example.com ", "reason": "asked by phone"}
            added = admin.post("/api/v1/suppressions", json=change)
            assert added.status_code == 201 and added.json()["email"] == "someone@example.com"
            assert_problem(admin.post("/api/v1/suppressions", json=change), 409)
            found = admin.get("/api/v1/suppressions", params={"address": "SOMEONE@example.com"})
            assert [r["reason"] for r in found.json()["items"]] == ["asked by phone"]
            no_reason = admin.post("/api/v1/suppressions/remove", json={"address": "x@y.z"})
            assert assert_problem(no_reason, 422)["errors"][0]["field"] == "body.reason"
            gone = {"address": "someone@example.com", "reason": "consent given again"}
            assert admin.post("/api/v1/suppressions/remove", json=gone).status_code == 200
            assert_problem(admin.post("/api/v1/suppressions/remove", json=gone), 404)
            assert (
                admin.get("/api/v1/suppressions", params={"address": "someone@example.com"}).json()[
                    "items"
                ]
                == []
            )
            full = admin.get("/api/v1/audit").json()["items"]
        with api.client("viewer") as viewer:
            seen = viewer.get("/api/v1/audit").json()["items"]
    actions = [(r["action"], r["detail"]) for r in reversed(full) if "suppression" in r["action"]]
    assert actions == [
        ("suppression add", {"address": "someone@example.com", "reason": "asked by phone"}),
        (
            "suppression remove",
            {
                "address": "someone@example.com",
                "reason": "consent given again",
                "was": "asked by phone",
            },
        ),
    ]
    assert all(
        r["detail"]["address"] == "(admin only)" for r in seen if "suppression" in r["action"]
    )


def test_a_template_preview_is_rendered_by_ses_for_one_user(settings: Settings) -> None:
    import psycopg

    name = f"prev_{uuid.uuid4().hex[:8]}"
    body = {
        "subject": "{{first_name}}, 50% off",
        "html": "<p>Hi {{first_name}} #{{user_id}}</p>",
        "text": "Hi {{first_name}}, code {{promo_code}}",
    }
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO users (id, email, first_name) SELECT coalesce(max(id), 0) + 1, "
            "'p@x.flashsend.test', 'Ann & Bo' FROM users RETURNING id"
        ).fetchone()
    assert row is not None
    uid = row[0]
    with serve(settings) as api, api.client("admin") as admin:
        assert admin.put(f"/api/v1/templates/{name}", json=body).status_code == 200
        shown = admin.get(f"/api/v1/templates/{name}/preview", params={"user_id": uid})
        assert shown.status_code == 200, shown.text
        preview = shown.json()
        assert preview["subject"] == "Ann & Bo, 50% off"
        assert preview["text"].strip() == "Hi Ann & Bo, code SAMPLE-CODE"
        assert preview["html"].strip() == f"<p>Hi Ann &amp; Bo #{uid}</p>"
        missing = admin.get(f"/api/v1/templates/{name}/preview", params={"user_id": 10**12})
        assert assert_problem(missing, 422)["errors"][0]["field"] == "query.user_id"
        assert_problem(admin.get("/api/v1/templates/nope_x/preview", params={"user_id": uid}), 404)
        with api.client("operator") as operator:
            assert_problem(
                operator.get(f"/api/v1/templates/{name}/preview", params={"user_id": uid}), 403
            )
