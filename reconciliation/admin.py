"""Reconciliation in the Django admin: read-only records; actions go through the same
transitions and services as the reconciler and the review queue."""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from reconciliation import services, transitions
from reconciliation.models import Case, CaseEvent, Decision, Evidence
from reconciliation.review import presentation
from reconciliation.review import services as review_rules


def _human(code: str) -> str:
    return (code or "").replace("_", " ").capitalize() or "—"


def labelled_filter(field: str, title: str, labels: dict[str, str]) -> type[admin.SimpleListFilter]:
    """A list filter over a code column that shows words: the known label, else the code
    humanised ("stale_result_ignored" → "Stale result ignored"). Values are the codes found."""

    class LabelledFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            codes = (model_admin.get_queryset(request).order_by(field)
                     .values_list(field, flat=True).distinct())
            return [(code, labels.get(code, _human(code))) for code in codes if code]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            value = self.value()
            return queryset.filter(**{field: value}) if value else queryset

    LabelledFilter.title = title
    return LabelledFilter


REASON_CODE_LABELS = {code: label for codes in review_rules.REASON_CODES.values()
                      for code, label in codes} | dict([review_rules.OTHER_REASON])


class _ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The inlines below list plain field names only, never fieldset groups.
        return list(cast("list[str]", self.fields or []))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class CaseEventInline(_ReadOnlyInline):
    model = CaseEvent
    fields = ["created_at", "from_state", "to_state", "actor", "reason", "data"]
    verbose_name_plural = "Case events (the audit trail)"


class EvidenceInline(_ReadOnlyInline):
    model = Evidence
    fields = ["created_at", "kind", "outcome", "actor", "created_by", "request", "response"]


class DecisionInline(_ReadOnlyInline):
    model = Decision
    fields = ["created_at", "action", "status", "decided_by", "reason_code", "note",
              "params_hash", "approves"]


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Records are written by transitions only: no add, change or delete here."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Case)
class CaseAdmin(_ReadOnlyAdmin):
    # Fits a 1,280 px screen: the operation ID wraps, codes are shown as words.
    list_display = ["id", "operation_id", "tool", "state", "why", "value_display",
                    "deadline_at", "resolution", "flagged"]
    list_display_links = ["id", "operation_id"]
    list_filter = ["state", "open_reason", "review_reason", "flagged",
                   labelled_filter("operation__tool", "tool", {}),
                   labelled_filter("operation__provider", "provider", {}), "resolution"]
    search_fields = ["operation__operation_id", "operation__run_id", "operation__subject",
                     "operation__customer_ref", "resolved_by"]
    list_select_related = ["operation"]
    date_hierarchy = "created_at"
    ordering = ["-created_at"]
    inlines = [EvidenceInline, CaseEventInline, DecisionInline]
    actions = ["check_provider_now", "check_again_soon", "escalate_to_review"]

    @admin.display(description="tool", ordering="operation__tool")
    def tool(self, case: Case) -> str:
        return _human(case.operation.tool)

    @admin.display(description="operation", ordering="operation__operation_id")
    def operation_id(self, case: Case) -> str:
        return case.operation.operation_id

    @admin.display(description="why", ordering="review_reason")
    def why(self, case: Case) -> str:
        if case.review_reason:
            return presentation.review_reason_label(case.review_reason)
        return case.get_open_reason_display()

    @admin.display(description="value", ordering="value_amount")
    def value_display(self, case: Case) -> str:
        return case.operation.value_display

    def has_review_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("reconciliation.review_case")

    def _actor(self, request: HttpRequest) -> str:
        return f"staff:{request.user.get_username()}"

    @admin.action(description="Check with the provider now (adds evidence)", permissions=["review"])
    def check_provider_now(self, request: HttpRequest, queryset: QuerySet[Case]) -> None:
        checked = 0
        for case in queryset.select_related("operation"):
            services.case_check_now(case=case, actor=self._actor(request), user=request.user)
            checked += 1
        self.message_user(request, f"Checked {checked} case(s); see their evidence.",
                          messages.INFO)

    @admin.action(description="Let the reconciler check again now", permissions=["review"])
    def check_again_soon(self, request: HttpRequest, queryset: QuerySet[Case]) -> None:
        due = 0
        for case in queryset.filter(state=Case.State.CHECKING):
            transitions.case_check_soon(case=case, actor=self._actor(request),
                                        reason="check_requested")
            due += 1
        self.message_user(request, f"{due} checking case(s) are due now.", messages.INFO)

    @admin.action(description="Escalate to the review queue", permissions=["review"])
    def escalate_to_review(self, request: HttpRequest, queryset: QuerySet[Case]) -> None:
        moved = 0
        for case in queryset.filter(state=Case.State.CHECKING):
            transitions.case_escalate(case=case, reason="manual", actor=self._actor(request))
            moved += 1
        self.message_user(request, f"{moved} case(s) moved to the review queue.", messages.INFO)


@admin.register(CaseEvent)
class CaseEventAdmin(_ReadOnlyAdmin):
    list_display = ["case", "from_state", "to_state", "actor", "reason_words", "created_at"]
    list_filter = [labelled_filter("to_state", "to state", dict(Case.State.choices)),
                   labelled_filter("reason", "reason", dict(Case.ReviewReason.choices))]

    @admin.display(description="reason", ordering="reason")
    def reason_words(self, event: CaseEvent) -> str:
        return _human(event.reason)
    search_fields = ["case__operation__operation_id", "case__operation__run_id", "actor"]
    list_select_related = ["case__operation"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Evidence)
class EvidenceAdmin(_ReadOnlyAdmin):
    list_display = ["case", "kind", "outcome_words", "actor", "created_by", "created_at"]
    list_filter = [labelled_filter("kind", "kind", {}),
                   labelled_filter("outcome", "answer", {
                       code: text[0].upper() + text[1:]
                       for code, text in presentation.CHECK_OUTCOMES.items()})]

    @admin.display(description="answer", ordering="outcome")
    def outcome_words(self, evidence: Evidence) -> str:
        text = presentation.CHECK_OUTCOMES.get(evidence.outcome)
        return text[0].upper() + text[1:] if text else _human(evidence.outcome)
    search_fields = ["case__operation__operation_id", "case__operation__run_id", "actor"]
    list_select_related = ["case__operation", "created_by"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Decision)
class DecisionAdmin(_ReadOnlyAdmin):
    list_display = ["case", "action", "status", "decided_by", "reason", "override",
                    "created_at"]
    list_filter = ["action", "status", labelled_filter("reason_code", "reason",
                                                       REASON_CODE_LABELS)]

    @admin.display(description="reason", ordering="reason_code")
    def reason(self, decision: Decision) -> str:
        return REASON_CODE_LABELS.get(decision.reason_code, _human(decision.reason_code))

    @admin.display(description="override", boolean=True)
    def override(self, decision: Decision) -> bool:
        return decision.is_override
    search_fields = ["case__operation__operation_id", "case__operation__run_id",
                     "decided_by__username", "note"]
    list_select_related = ["case__operation", "decided_by"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# ==============================================================================================
# BEGIN review decisions on the Case change form — maintained with the review queue
# (reconciliation/review/services.py, reconciliation/forms.py, templates/admin/reconciliation/case/
# decide.html). Django 6.1 change-form actions; every one goes through the same services as
# /review/: the claim, a decision with its reason code and note, four-eyes approval.
# ==============================================================================================
from django.contrib.admin.options import ActionLocation  # noqa: E402
from django.template.response import TemplateResponse  # noqa: E402

from config.http import authenticated_user  # noqa: E402
from reconciliation.forms import ApprovalForm  # noqa: E402
from reconciliation.review import services as review_services  # noqa: E402


class _AdminDecisionForm(ApprovalForm):
    """Reason, note and params hash for one fixed action (the action is the admin action)."""


def _one_case(queryset: QuerySet[Case]) -> Case:
    return queryset.select_related("operation").get()


def _refused(modeladmin: admin.ModelAdmin, request: HttpRequest,
             error: review_services.ReviewError) -> None:
    modeladmin.message_user(request, error.message, messages.ERROR)


@admin.action(description="Claim this case for me (15 minutes)", permissions=["review"],
              location=ActionLocation.CHANGE_FORM)
def claim_for_me(modeladmin: admin.ModelAdmin, request: HttpRequest,
                 queryset: QuerySet[Case]) -> None:
    case = _one_case(queryset)
    try:
        review_services.case_claim(case_id=case.pk, user=authenticated_user(request))
    except review_services.ReviewError as error:
        _refused(modeladmin, request, error)
        return
    modeladmin.message_user(request, f"You hold case {case.pk} for 15 minutes.", messages.INFO)


@admin.action(description="Release my claim", permissions=["review"],
              location=ActionLocation.CHANGE_FORM)
def release_my_claim(modeladmin: admin.ModelAdmin, request: HttpRequest,
                     queryset: QuerySet[Case]) -> None:
    case = _one_case(queryset)
    try:
        review_services.case_release(case_id=case.pk, user=authenticated_user(request))
    except review_services.ReviewError as error:
        _refused(modeladmin, request, error)
        return
    modeladmin.message_user(request, f"Case {case.pk} released.", messages.INFO)


def _decision_page(modeladmin: admin.ModelAdmin, request: HttpRequest, case: Case, *,
                   action: str, action_name: str, title: str,
                   form: ApprovalForm, pending: Decision | None = None) -> TemplateResponse:
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title, "case": case, "operation": case.operation, "form": form,
        "action": action, "action_name": action_name, "pending": pending,
        "four_eyes": review_services.needs_four_eyes(case.operation),
        "opts": modeladmin.model._meta,
        "review_url": f"/review/cases/{case.pk}/",
    }
    return TemplateResponse(request, "admin/reconciliation/case/decide.html", context)


def _decide(action: str, action_name: str, title: str) -> Any:
    def decide(modeladmin: admin.ModelAdmin, request: HttpRequest,
               queryset: QuerySet[Case]) -> TemplateResponse | None:
        case = _one_case(queryset)
        if request.POST.get("post") != "yes":
            form = _AdminDecisionForm(initial={"params_hash": case.operation.params_hash},
                                      action=action)
            return _decision_page(modeladmin, request, case, action=action,
                                  action_name=action_name, title=title, form=form)
        form = _AdminDecisionForm(request.POST, action=action)
        if not form.is_valid():
            return _decision_page(modeladmin, request, case, action=action,
                                  action_name=action_name, title=title, form=form)
        data = form.cleaned_data
        user = authenticated_user(request)
        try:
            # Deciding needs the claim: take it (refused while another reviewer holds it).
            review_services.case_claim(case_id=case.pk, user=user)
            outcome = review_services.case_decide(
                case_id=case.pk, user=user, action=action,
                reason_code=data["reason_code"], note=data["note"],
                params_hash=data["params_hash"])
        except review_services.ReviewError as error:
            _refused(modeladmin, request, error)
            return None
        modeladmin.message_user(request, outcome.message, messages.SUCCESS)
        return None

    decide.__name__ = action_name
    return admin.action(description=title, permissions=["review"],
                        location=ActionLocation.CHANGE_FORM)(decide)


decide_confirm = _decide(Decision.Action.CONFIRM, "decide_confirm",
                         "Decide: confirm — it happened (operation succeeds)")
decide_reject = _decide(Decision.Action.REJECT, "decide_reject",
                        "Decide: reject — it did not happen (operation fails)")
decide_resend = _decide(Decision.Action.RESEND, "decide_resend",
                        "Decide: re-send with the same key (inside retention only)")


@admin.action(description="Approve the decision waiting for a second reviewer",
              permissions=["review"], location=ActionLocation.CHANGE_FORM)
def approve_pending(modeladmin: admin.ModelAdmin, request: HttpRequest,
                    queryset: QuerySet[Case]) -> TemplateResponse | None:
    case = _one_case(queryset)
    pending = case.decisions.filter(status=Decision.Status.AWAITING_SECOND).first()
    if pending is None:
        modeladmin.message_user(request, "No decision on this case is waiting for approval.",
                                messages.WARNING)
        return None
    title = f"Approve: {pending.get_action_display()}"
    form = _AdminDecisionForm(request.POST if request.POST.get("post") == "yes" else None,
                              initial={"params_hash": case.operation.params_hash},
                              action=pending.action)
    if not form.is_bound or not form.is_valid():
        return _decision_page(modeladmin, request, case, action=pending.action,
                              action_name="approve_pending", title=title, form=form,
                              pending=pending)
    user = authenticated_user(request)
    try:
        review_services.case_claim(case_id=case.pk, user=user)
        outcome = review_services.decision_approve(
            decision_id=pending.pk, user=user,
            reason_code=form.cleaned_data["reason_code"], note=form.cleaned_data["note"],
            params_hash=form.cleaned_data["params_hash"])
    except review_services.ReviewError as error:
        _refused(modeladmin, request, error)
        return None
    modeladmin.message_user(request, f"2 of 2 approvals. {outcome.message}", messages.SUCCESS)
    return None


CaseAdmin.actions = [*CaseAdmin.actions, claim_for_me, release_my_claim, decide_confirm,
                     decide_reject, decide_resend, approve_pending]
# END review decisions on the Case change form
# ==============================================================================================
