from __future__ import annotations

from django.urls import path

from portal import views

app_name = "portal"

urlpatterns = [
    path("<str:token>/", views.status_page, name="status"),
]
