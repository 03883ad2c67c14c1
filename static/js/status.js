/* The customer's status page, with JavaScript: reveal what only a script makes true (the page
   updating by itself, pausing it), and put the reader's local time beside each UTC time. A
   static file under the strict CSP; without it the page is plain HTML with a refresh link. */
(function () {
  "use strict";

  var zone = "";
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (error) {
    zone = "";
  }

  function localTime(element) {
    if (!zone || zone === "UTC" || zone === "Etc/UTC" || element.dataset.localDone) return;
    var moment = new Date(element.getAttribute("datetime"));
    if (isNaN(moment.getTime())) return;
    var words = new Intl.DateTimeFormat(undefined, {
      hour: "2-digit", minute: "2-digit", day: "numeric", month: "short", timeZone: zone,
    }).format(moment);
    var note = document.createElement("span");
    note.className = "local-time";
    note.textContent = " (" + words + " your time, " + zone.replace(/_/g, " ") + ")";
    element.insertAdjacentElement("afterend", note);
    element.dataset.localDone = "1";
  }

  function enhance(root) {
    root.querySelectorAll(".js-only[hidden]").forEach(function (element) {
      element.hidden = false;
    });
    root.querySelectorAll("time[data-local]").forEach(localTime);
  }

  document.addEventListener("DOMContentLoaded", function () { enhance(document); });
  // Content htmx swaps in (the polled status, details and controls) is enhanced the same way.
  document.addEventListener("htmx:load", function (event) {
    enhance(event.target.parentNode || document);
  });
})();
