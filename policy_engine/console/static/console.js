// policy-engine console: live approval updates (Server-Sent Events). Everything works without it.
"use strict";
(function () {
  var badge = document.getElementById("pending-badge");
  if (!badge || !window.EventSource) { return; }
  var source = new EventSource(badge.getAttribute("data-stream"));
  var table = document.getElementById("approvals");
  source.addEventListener("pending", function (event) {
    var data = JSON.parse(event.data);
    badge.textContent = data.pending > 0 ? String(data.pending) : "";
    badge.setAttribute("aria-label", data.pending + " consent request(s) waiting");
    // refresh when the queue differs from what this page shows (not only on changes: the
    // page may have been rendered just before a request arrived)
    if (table && (table.getAttribute("data-newest") !== data.newest ||
                  table.getAttribute("data-pending") !== String(data.pending))) {
      // refresh the list in place: fetch this page and swap the table body
      fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.text(); })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById("approvals");
          if (fresh) { table.replaceWith(fresh); table = fresh; }
        });
    }
  });
})();
