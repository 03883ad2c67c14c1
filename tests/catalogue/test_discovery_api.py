"""GET /api/v1/tools and /api/v1/tools/{name}: what an agent or SDK may use, from the catalogue."""

from __future__ import annotations

from rest_framework.test import APIClient

from ledger.tools import get_tool


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_the_list_shows_only_the_tools_this_agent_may_use(make_agent):
    _, token = make_agent("mailer", tools=("send_email", "create_ticket"))

    response = client_for(token).get("/api/v1/tools")

    assert response.status_code == 200
    assert [tool["name"] for tool in response.json()["tools"]] == ["create_ticket", "send_email"]


def test_a_tool_resource_carries_the_shared_contract(api):
    response = api.get("/api/v1/tools/refund")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"name", "version", "description", "params_schema", "intent_fields",
                         "free_text_fields", "secret_fields", "value", "high_value_thresholds",
                         "four_eyes_thresholds", "client_execution"}
    assert body["version"] == 1
    assert body["intent_fields"] == ["invoice", "amount", "currency", "payee"]
    assert body["free_text_fields"] == ["memo"]
    assert body["value"] == {"amount_field": "amount", "currency_field": "currency"}
    assert body["high_value_thresholds"]["EUR"] == 100_000
    assert body["four_eyes_thresholds"]["JPY"] == 1_500_000
    assert body["params_schema"]["additionalProperties"] is False
    assert body["params_schema"]["properties"]["amount"]["type"] == "integer"
    assert body["client_execution"] is True
    assert body == get_tool("refund").resource()


def test_a_tool_without_a_value_says_so(api):
    body = api.get("/api/v1/tools/send_email").json()
    assert body["value"] is None and body["high_value_thresholds"] == {}


def test_connector_settings_never_reach_agents(api):
    text = api.get("/api/v1/tools").content.decode()
    assert "base_url" not in text and "Idempotency-Key" not in text and "/v1/effects" not in text


def test_unknown_and_forbidden_tools_get_the_same_404_problem(make_agent):
    _, token = make_agent("mailer", tools=("send_email",))
    client = client_for(token)

    forbidden = client.get("/api/v1/tools/refund")
    unknown = client.get("/api/v1/tools/launch_missiles")

    for response in (forbidden, unknown):
        assert response.status_code == 404
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["detail"] == "No such tool."


def test_discovery_needs_a_credential(db):
    assert APIClient().get("/api/v1/tools").status_code == 401
    assert APIClient().get("/api/v1/tools/refund").status_code == 401


def test_the_latest_version_is_the_one_discovered(api, stripe_smtp_tools):
    assert api.get("/api/v1/tools/refund").json()["version"] == 2


def test_the_openapi_document_describes_both_endpoints(db, admin_client):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)

    assert "/api/v1/tools" in schema["paths"] and "/api/v1/tools/{name}" in schema["paths"]
    tool = schema["components"]["schemas"]["Tool"]
    assert {"params_schema", "intent_fields", "free_text_fields", "high_value_thresholds",
            "four_eyes_thresholds", "client_execution", "value"} <= set(tool["properties"])
    assert schema["paths"]["/api/v1/tools"]["get"]["operationId"] == "tools_list"
    assert schema["paths"]["/api/v1/tools/{name}"]["get"]["operationId"] == "tools_retrieve"
    listed = schema["paths"]["/api/v1/tools"]["get"]["responses"]["200"]
    assert listed["content"]["application/json"]["schema"]["$ref"].endswith("/ToolList")
