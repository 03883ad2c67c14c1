"""Forms of the review queue. The services re-check everything; the forms give field-level
messages and keep what the reviewer typed."""

from __future__ import annotations

from typing import Any

from django import forms

from ledger.money import format_money, is_currency, parse_money
from reconciliation.models import Decision
from reconciliation.review import presentation, selectors, services

Action = Decision.Action


class MoneyField(forms.CharField):
    """An amount a person types, parsed with the currency's ISO 4217 exponent in the active
    locale (ledger.money.parse_money) into minor units. The form says which currency."""

    widget = forms.TextInput(attrs={"inputmode": "decimal", "autocomplete": "off"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 40)
        super().__init__(*args, **kwargs)
        self.currency = ""

    def clean(self, value: Any) -> int | None:
        text = super().clean(value)
        if not text:
            return None
        if not self.currency:
            raise forms.ValidationError("Choose the currency the amount is in.")
        try:
            return parse_money(text, self.currency)
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None


def _money_field(form: forms.BaseForm, name: str) -> MoneyField:
    field = form.fields[name]
    assert isinstance(field, MoneyField)
    return field


def _choice_field(form: forms.BaseForm, name: str) -> forms.ChoiceField:
    """One of the form's ChoiceFields, typed as such (form.fields holds any Field)."""
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    return field


class QueueFilterForm(forms.Form):
    """The queue's filters; they live in the query string so a view can be shared."""

    tool = forms.ChoiceField(required=False)
    provider = forms.ChoiceField(required=False)
    reason = forms.ChoiceField(required=False, label="Why in review")
    currency = forms.CharField(required=False, max_length=3, label="Currency",
                               widget=forms.TextInput(attrs={
                                   "size": 4, "placeholder": "EUR", "autocapitalize": "characters",
                                   "spellcheck": "false"}))
    min_value = MoneyField(required=False, label="Value from")
    max_value = MoneyField(required=False, label="Value to")
    age = forms.ChoiceField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        anything = [("", "Any")]
        _choice_field(self, "tool").choices = anything + selectors.tool_choices()
        _choice_field(self, "provider").choices = anything + selectors.provider_choices()
        _choice_field(self, "reason").choices = anything + presentation.review_reason_choices()
        _choice_field(self, "age").choices = anything + [
            (key, label) for key, (label, _) in selectors.AGE_FILTERS.items()
        ]

    def clean_currency(self) -> str:
        currency = (self.cleaned_data.get("currency") or "").strip().upper()
        if currency and not is_currency(currency):
            raise forms.ValidationError(f"{currency} is not an ISO 4217 currency code.")
        return currency

    def full_clean(self) -> None:
        # The amounts are parsed in the currency the same form names.
        currency = str(self.data.get("currency", "") or "").strip().upper()
        for name in ("min_value", "max_value"):
            _money_field(self, name).currency = currency if is_currency(currency) else ""
        super().full_clean()

    def filters(self) -> selectors.QueueFilters:
        if not self.is_valid():
            # Bad values are ignored rather than failing the whole queue.
            data = {k: v for k, v in self.cleaned_data.items() if k not in self.errors}
        else:
            data = self.cleaned_data
        return selectors.QueueFilters(
            tool=data.get("tool") or "",
            provider=data.get("provider") or "",
            reason=data.get("reason") or "",
            currency=data.get("currency") or "",
            min_value=data.get("min_value"),
            max_value=data.get("max_value"),
            age=data.get("age") or "",
        )


def _reason_choices() -> list[Any]:
    groups: list[Any] = [("", "Choose a reason…")]
    titles = {Action.CONFIRM: "Confirming", Action.REJECT: "Rejecting",
              Action.RESEND: "Re-sending"}
    for action, codes in services.REASON_CODES.items():
        groups.append((titles[Action(action)], list(codes)))
    groups.append(services.OTHER_REASON)
    return groups


class _ReasonedForm(forms.Form):
    reason_code = forms.ChoiceField(label="Reason")
    note = forms.CharField(
        max_length=4000, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What did you check, and what did you see? Kept in the audit trail.",
    )
    params_hash = forms.CharField(widget=forms.HiddenInput, max_length=71)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "reason_code").choices = _reason_choices()

    def clean_note(self) -> str:
        note = self.cleaned_data["note"].strip()
        if not note:
            raise forms.ValidationError("Add a note: what did you check, and what did you see?")
        return note


class DecisionForm(_ReasonedForm):
    action = forms.ChoiceField(
        choices=Action.choices, widget=forms.RadioSelect, label="Decision",
    )
    amount_checked = MoneyField(
        required=False, label="Amount you checked (optional)",
        help_text="The amount you saw at the provider or on the statement, as you read it.",
    )
    override = forms.BooleanField(
        required=False, label="I am deciding against the provider's evidence (override)",
    )
    override_reason = forms.CharField(
        required=False, max_length=4000, label="Why the evidence is wrong",
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    field_order = ["action", "reason_code", "note", "amount_checked", "override",
                   "override_reason", "params_hash"]

    def __init__(self, *args: Any, resend_allowed: bool = True, amount: int | None = None,
                 currency: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resend_allowed = resend_allowed
        self.amount = amount
        self.currency = currency if is_currency(currency) else ""
        field = _money_field(self, "amount_checked")
        field.currency = self.currency
        if self.currency:
            field.label = f"Amount you checked, in {self.currency} (optional)"
        else:
            del self.fields["amount_checked"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None  # Form.clean() returns cleaned_data
        action, code = data.get("action"), data.get("reason_code")
        if action == Action.RESEND and not self.resend_allowed:
            self.add_error("action", "Re-sending is only possible while the provider still "
                                     "remembers the idempotency key.")
        if action and code and code not in {c for c, _ in services.reason_choices(action)}:
            self.add_error("reason_code", "This reason does not fit the decision you chose.")
        checked = data.get("amount_checked")
        if checked is not None and self.amount is not None and checked != self.amount:
            self.add_error("amount_checked", (
                f"You typed {format_money(checked, self.currency)}, but the intent is "
                f"{format_money(self.amount, self.currency)}: check you are looking at the "
                "right record."))
        if data.get("override") and not (data.get("override_reason") or "").strip():
            self.add_error("override_reason", "Write why you decide against the evidence.")
        if not data.get("override"):
            data["override_reason"] = ""
        return data


class ApprovalForm(_ReasonedForm):
    def __init__(self, *args: Any, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.action = action

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None  # Form.clean() returns cleaned_data
        code = data.get("reason_code")
        if code and code not in {c for c, _ in services.reason_choices(self.action)}:
            self.add_error("reason_code", "This reason does not fit the proposed decision.")
        return data


class WithdrawForm(forms.Form):
    note = forms.CharField(max_length=4000, required=False,
                           widget=forms.Textarea(attrs={"rows": 2}))


class NoteForm(forms.Form):
    text = forms.CharField(label="Add a note", max_length=4000,
                           widget=forms.Textarea(attrs={"rows": 3}))
