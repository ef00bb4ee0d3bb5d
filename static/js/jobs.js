// Follows a running job: polls GET /api/jobs/<id> once a second and updates the figures until the job ends.
(function () {
  var card = document.getElementById("job");
  if (!card) return;
  function show(job) {
    card.querySelectorAll("[data-field]").forEach(function (el) {
      var field = el.getAttribute("data-field");
      if (field === "progress") el.value = job.progress;
      else if (field === "percent") el.textContent = (job.progress * 100).toFixed(1) + "%";
      else if (field === "state") { el.textContent = job.state; el.className = "badge state-" + job.state; }
      else el.textContent = job[field];
    });
    if (job.state !== "running") card.querySelectorAll("form").forEach(function (form) { form.remove(); });
  }
  function poll() {
    fetch(card.getAttribute("data-job-url"), {headers: {"Accept": "application/json"}})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (job) { show(job); if (job.state === "running") setTimeout(poll, 1000); })
      .catch(function () { setTimeout(poll, 3000); });
  }
  if (card.querySelector("[data-field=state]").textContent === "running") setTimeout(poll, 1000);
})();
