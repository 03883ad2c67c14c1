/* Review queue keyboard shortcuts: j/k move between cases, Enter opens, c claims or releases,
   x ticks the row for a bulk action, ? lists the shortcuts. A static file under the strict CSP
   (no inline script); without it every action is still a link, a button or a form. */
(function () {
  "use strict";

  var current = null; // the id of the selected row, kept across htmx swaps of that row

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("tr[id^='case-row-']"));
  }

  function typing(target) {
    if (!target || !target.closest) return false;
    return Boolean(target.closest("input, textarea, select, [contenteditable=''], [contenteditable='true'], dialog[open]"));
  }

  function select(row) {
    rows().forEach(function (each) {
      each.classList.remove("is-current");
      each.removeAttribute("aria-current");
    });
    if (!row) return;
    current = row.id;
    row.classList.add("is-current");
    row.setAttribute("aria-current", "true");
    var link = row.querySelector("a.case-link");
    if (link) link.focus();
    row.scrollIntoView({ block: "nearest" });
  }

  function selectedRow() {
    var row = current && document.getElementById(current);
    if (row) return row;
    var focused = document.activeElement && document.activeElement.closest &&
      document.activeElement.closest("tr[id^='case-row-']");
    return focused || null;
  }

  function move(step) {
    var list = rows();
    if (!list.length) return;
    var index = list.indexOf(selectedRow());
    var next = index === -1 ? (step > 0 ? 0 : list.length - 1)
      : Math.min(list.length - 1, Math.max(0, index + step));
    select(list[next]);
  }

  function openShortcuts() {
    var dialog = document.getElementById("shortcuts");
    if (dialog && !dialog.open) dialog.showModal();
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event.target)) return;
    var row;
    switch (event.key) {
      case "j":
        move(1);
        break;
      case "k":
        move(-1);
        break;
      case "Enter":
        row = selectedRow();
        if (!row || event.target.closest("button, summary")) return;
        var link = row.querySelector("a.case-link");
        if (!link) return;
        link.click();
        break;
      case "c":
        row = selectedRow();
        var toggle = row && row.querySelector("button[id^='claim-toggle-']");
        if (!toggle) return;
        toggle.click();
        break;
      case "x":
        row = selectedRow();
        var box = row && row.querySelector("input[type=checkbox][name=case]");
        if (!box) return;
        box.checked = !box.checked;
        break;
      case "?":
        openShortcuts();
        break;
      default:
        return;
    }
    event.preventDefault();
  });

  // A row swapped by htmx (claim/release) stays selected; focus stays where htmx put it.
  document.addEventListener("htmx:afterSettle", function () {
    var row = current && document.getElementById(current);
    if (row) {
      row.classList.add("is-current");
      row.setAttribute("aria-current", "true");
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var opener = document.getElementById("shortcuts-open");
    if (opener) {
      opener.hidden = false;
      opener.addEventListener("click", openShortcuts);
    }
  });
})();
