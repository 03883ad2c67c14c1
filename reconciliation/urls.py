from __future__ import annotations

app_name = "review"

urlpatterns: list = []
