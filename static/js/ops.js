/* The overview's polite refresh. htmx polls the live part every 30 s (hx-trigger on #live);
   while the tab is hidden each poll is cancelled before it is sent, and when the tab becomes
   visible again the page refreshes once at once. No inline script: the CSP forbids it. */
(function () {
  "use strict";
  document.addEventListener("htmx:beforeRequest", function (event) {
    var source = event.detail && event.detail.elt;
    var config = event.detail && event.detail.requestConfig;
    var trigger = config && config.triggeringEvent;
    if (source && source.hasAttribute && source.hasAttribute("data-poll") &&
        document.visibilityState === "hidden" && !(trigger && trigger.type === "ops:visible")) {
      event.preventDefault();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState !== "visible" || !window.htmx) { return; }
    var live = document.querySelector("[data-poll]");
    if (live) { window.htmx.trigger(live, "ops:visible"); }
  });
})();
