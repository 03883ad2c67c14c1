from __future__ import annotations

from django.urls import path

from reconciliation import views

app_name = "review"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("new/", views.new_arrivals, name="new_arrivals"),
    path("bulk/", views.bulk_claim, name="bulk"),
    path("cases/<int:pk>/", views.case_detail, name="case"),
    path("cases/<int:pk>/claim/", views.claim, name="claim"),
    path("cases/<int:pk>/release/", views.release, name="release"),
    path("cases/<int:pk>/decide/", views.decide, name="decide"),
    path("cases/<int:pk>/check/", views.check_provider, name="check"),
    path("cases/<int:pk>/notes/", views.add_note, name="note"),
    path("decisions/<int:pk>/approve/", views.approve, name="approve"),
    path("decisions/<int:pk>/withdraw/", views.withdraw, name="withdraw"),
]
