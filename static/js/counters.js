// Progressive enhancement for the counters page: +1 through the JSON API, then redraw the total and the shards.
// Without JavaScript the same buttons post their forms and the page reloads.
//
// One click is one increment. A signed-in person's click on a named counter carries a fresh Idempotency-Key (the page
// gives their forms a key field; a key is its caller's own, so an anonymous visitor's has none): if the request's fate
// is unknown (the network failed), the plain form is posted with that same key, and the server applies it once.
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
      await refresh(card, form.dataset.refresh);
    } catch (err) {
      window.location.reload();  // the increment counted; show its result the safe way
    } finally {
      button.disabled = false;
    }
  });
});

// A counter as it stands (GET /api/counters/<name>?shards=1), drawn on its card: total, shard count, bars.
async function refresh(card, url) {
  const res = await fetch(url, { headers: { Accept: "application/json" } });
  if (!res.ok) throw new Error(`${url}: ${res.status}`);
  const data = await res.json();
  card.querySelector("[data-total]").textContent = data.count;
  const source = card.querySelector("[data-source]");
  if (source) source.textContent = data.cached ? "from memcache" : "summed from shards";
  const n = card.querySelector("[data-num-shards]");
  if (n) n.textContent = data.num_shards;
  drawStrip(card.querySelector("[data-shards]"), data.shards);
}

// A burst, watched: its request is sent, and while it runs the counter is read every POLL_MS and redrawn, so the
// bars multiply on screen as the adaptive counter grows. Sequential reads (one at a time), at most MAX_POLLS of
// them. Each read of an admin's bills a read per shard: a few hundred reads for a burst, an admin's demo.
const POLL_MS = 300;
const MAX_POLLS = 200;
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function watchBurst(card, burstUrl, refreshUrl, body) {
  // data-running: from the burst's request to its answer (the browser tests tell live frames from the last by it).
  card.dataset.running = "";
  let finished = false;
  const burst = fetch(burstUrl, {
    method: "POST", headers: { Accept: "application/json", "Content-Type": "application/json" },
    body: JSON.stringify(body),
  }).finally(() => {
    finished = true;
    delete card.dataset.running;
  });
  for (let polls = 0; !finished && polls < MAX_POLLS; polls++) {
    await Promise.race([burst.catch(() => null), pause(POLL_MS)]);
    if (!finished) await refresh(card, refreshUrl).catch(() => null);  // a missed frame is no failure
  }
  const res = await burst;
  const data = await res.json().catch(() => null);
  if (!res.ok) throw new Error(data && data.error ? data.error.message : `The burst failed (${res.status}).`);
  await refresh(card, refreshUrl);
  return data;
}

function burstSummary(data, writers) {
  return `${data.name}: ${data.increments} increments from ${writers} writers took ` +
    `${(data.attempts / data.increments).toFixed(2)} attempts each; it has ${plural(data.num_shards, "shard")} now.`;
}

function plural(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

function tell(card, text, error) {
  say(card, text);
  card.querySelector("[data-note]").className = error ? "flash error" : "flash info";
}

// A named counter's burst button: its card's bars redrawn while the burst runs.
document.querySelectorAll("form[data-burst]").forEach((form) => {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const card = form.closest(".card");
    const button = form.querySelector("button");
    const writers = Number(form.elements.writers.value);
    button.disabled = true;
    try {
      const data = await watchBurst(card, form.dataset.burst, form.dataset.refresh,
        { writers, increments: Number(form.elements.increments.value) });
      tell(card, burstSummary(data, writers));
    } catch (err) {
      tell(card, err.message, true);
    } finally {
      button.disabled = false;
    }
  });
});

// "Watch one grow": the counter named by the page is created adaptive (one shard), shown on a card of its own, and
// burst while its bars are redrawn. Without this script the form posts, and the page shows where it ended.
document.querySelectorAll("form[data-burst-new]").forEach((form) => {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = form.elements.name.value;
    const card = document.getElementById("burst-live");
    const button = form.querySelector("button");
    const api = `/api/counters/${encodeURIComponent(name)}`;
    button.disabled = true;
    try {
      const made = await fetch(api, {
        method: "PUT", headers: { Accept: "application/json", "Content-Type": "application/json" },
        body: JSON.stringify({ mode: "adaptive" }),
      });
      if (!made.ok) throw new Error(`The counter could not be created (${made.status}).`);
      card.querySelector("[data-name]").textContent = name;
      card.hidden = false;
      await refresh(card, `${api}?shards=1`);
      const writers = Number(form.elements.writers.value);
      const data = await watchBurst(card, `${api}/burst`, `${api}?shards=1`,
        { writers, increments: Number(form.elements.increments.value) });
      tell(card, `New adaptive counter ${burstSummary(data, writers)}`);
      // The next click bursts a new counter again: the page's name with another random tail.
      form.elements.name.value = name.replace(/-[0-9a-f]+$/, `-${newKey().slice(0, 4)}`);
    } catch (err) {
      card.hidden = false;
      tell(card, err.message, true);
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
  strip.setAttribute("aria-label", `${plural(shards.length, "shard")}, counts ${shards.join(", ")}`);
}
