from __future__ import annotations

from django.urls import path

from ledger import api

app_name = "api"

urlpatterns = [
    path("operations", api.OperationSubmitApi.as_view(), name="operation-submit"),
    path("operations/<str:operation_id>", api.OperationDetailApi.as_view(),
         name="operation-detail"),
    path("operations/<str:operation_id>/heartbeat", api.OperationHeartbeatApi.as_view(),
         name="operation-heartbeat"),
    path("operations/<str:operation_id>/outcome", api.OperationOutcomeApi.as_view(),
         name="operation-outcome"),
    path("tools", api.ToolListApi.as_view(), name="tool-list"),
    path("tools/<str:name>", api.ToolDetailApi.as_view(), name="tool-detail"),
    path("runs/<str:run_id>/operations", api.RunOperationsApi.as_view(), name="run-operations"),
]
