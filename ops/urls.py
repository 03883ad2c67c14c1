from __future__ import annotations

from django.urls import path

from ops import views

app_name = "ops"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("operations/", views.operations, name="operations"),
    path("operations/<int:pk>/", views.operation_detail, name="operation"),
]
