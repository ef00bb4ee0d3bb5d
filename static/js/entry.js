// Counts this view of the entry with a POST of its own (the page's GET writes nothing), then shows the new count.
(function () {
  var entry = document.querySelector("[data-view-url]");
  if (!entry) return;
  fetch(entry.getAttribute("data-view-url"), {method: "POST", headers: {"Accept": "application/json"}})
    .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
    .then(function (data) {
      var views = entry.querySelector("[data-views]");
      if (views) views.textContent = data.views + (data.views === 1 ? " view" : " views");
    })
    .catch(function () {});  // an uncounted view is not the reader's problem
})();
