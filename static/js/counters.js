// Progressive enhancement for the counters page: +1 through the JSON API, then redraw the total and the shards.
// Without JavaScript the same buttons post their forms and the page reloads.
document.querySelectorAll("form[data-increment]").forEach((form) => {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const card = form.closest(".card");
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const res = await fetch(form.dataset.increment, { method: "POST", headers: { Accept: "application/json" } });
      if (!res.ok) throw new Error((await res.json()).error.message);
      const data = await (await fetch(form.dataset.refresh)).json();
      card.querySelector("[data-total]").textContent = data.count;
      const source = card.querySelector("[data-source]");
      if (source) source.textContent = data.cached ? "from memcache" : "summed from shards";
      const n = card.querySelector("[data-num-shards]");
      if (n) n.textContent = data.num_shards;
      drawStrip(card.querySelector("[data-shards]"), data.shards);
    } catch (err) {
      form.submit();  // fall back to the plain form post
    } finally {
      button.disabled = false;
    }
  });
});

function drawStrip(strip, shards) {
  const top = Math.max(0, ...shards);
  strip.replaceChildren(...shards.map((n, i) => {
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.setProperty("--h", top ? `${(100 * n) / top}%` : "0%");
    bar.title = `shard ${i}: ${n}`;
    return bar;
  }));
  strip.setAttribute("aria-label", `${shards.length} shards, counts ${shards.join(", ")}`);
}
