// Progressive enhancement for the counters page: +1 through the JSON API, then redraw the total and the shards.
// Without JavaScript the same buttons post their forms and the page reloads.
//
// One click is one increment. Each click on a named counter carries a fresh Idempotency-Key: if the request's fate is
// unknown (the network failed), the plain form is posted with that same key, and the server applies it at most once.
// Once the increment has succeeded nothing is posted again: a failed refresh only reloads the page (a GET).
function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));  // randomUUID needs a secure context; this does not
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function say(card, text) {
  let note = card.querySelector("[data-note]");
  if (!note) {
    note = document.createElement("p");
    note.className = "flash error";
    note.setAttribute("role", "status");
    note.dataset.note = "";
    card.append(note);
  }
  note.textContent = text;
}

document.querySelectorAll("form[data-increment]").forEach((form) => {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const card = form.closest(".card");
    const button = form.querySelector("button");
    const keyField = form.querySelector("input[name=idempotency_key]");
    const key = keyField ? newKey() : null;
    button.disabled = true;
    let res;
    try {
      res = await fetch(form.dataset.increment, {
        method: "POST", headers: key ? { Accept: "application/json", "Idempotency-Key": key } : { Accept: "application/json" },
      });
    } catch (err) {
      // Sent or not, we cannot tell: only a keyed increment may be sent again.
      if (keyField) {
        keyField.value = key;
        form.submit();
      } else {
        say(card, "The server could not be reached; the count may or may not have gone up. Reload to see.");
        button.disabled = false;
      }
      return;
    }
    try {
      if (!res.ok) {
        const body = await res.json().catch(() => null);
        say(card, body && body.error ? body.error.message : `The increment failed (${res.status}).`);
        return;
      }
      const data = await (await fetch(form.dataset.refresh, { headers: { Accept: "application/json" } })).json();
      card.querySelector("[data-total]").textContent = data.count;
      const source = card.querySelector("[data-source]");
      if (source) source.textContent = data.cached ? "from memcache" : "summed from shards";
      const n = card.querySelector("[data-num-shards]");
      if (n) n.textContent = data.num_shards;
      drawStrip(card.querySelector("[data-shards]"), data.shards);
    } catch (err) {
      window.location.reload();  // the increment counted; show its result the safe way
    } finally {
      button.disabled = false;
    }
  });
});

const SVG = "http://www.w3.org/2000/svg";

// The same drawing as templates/counters/_strip.html: an SVG bar per shard, its height its share of the tallest.
// Attributes, not inline styles, so the page's Content-Security-Policy needs no 'unsafe-inline'.
function drawStrip(strip, shards) {
  const top = Math.max(0, ...shards);
  strip.setAttribute("viewBox", `0 0 ${shards.length} 100`);
  strip.replaceChildren(...shards.map((n, i) => {
    const h = top ? Math.max(2, Math.round((1000 * n) / top) / 10) : 2;
    const bar = document.createElementNS(SVG, "rect");
    bar.setAttribute("class", "bar");
    bar.setAttribute("x", i + 0.1);
    bar.setAttribute("width", 0.8);
    bar.setAttribute("y", 100 - h);
    bar.setAttribute("height", h);
    const title = document.createElementNS(SVG, "title");
    title.textContent = `shard ${i}: ${n}`;
    bar.append(title);
    return bar;
  }));
  strip.setAttribute("aria-label", `${shards.length} shards, counts ${shards.join(", ")}`);
}
