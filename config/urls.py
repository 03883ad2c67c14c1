from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from config import views
from ledger.docs import ApiDocsView

# Changelists need the width (operation IDs are long): the app list stays on the admin index
# and in the breadcrumbs instead of a sidebar on every page.
admin.site.enable_nav_sidebar = False

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("ledger.urls")),
    path("api/schema/", SpectacularAPIView.as_view(
        authentication_classes=[], permission_classes=[]), name="schema"),
    path("api/docs/", ApiDocsView.as_view(url_name="schema"), name="api-docs"),
    path("status/", include("portal.urls")),
    path("review/", include("reconciliation.urls")),
    path("ops/", include("ops.urls")),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
]
