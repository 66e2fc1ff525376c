// The agent-memory dashboard: reads /v1/agents, /metrics and /health every few seconds.
// Plain browser JavaScript, no build step, no dependencies. Agent ids are arbitrary strings:
// they are only ever set as text (textContent, attributes), never parsed as HTML.
"use strict";

(() => {
  const REFRESH_MS = 3000;
  const WINDOW_S = 600; // what the rate cards and sparklines cover
  const SMOOTH_S = 30; // each sparkline point: the trailing half minute
  const MAX_ROWS = 500; // the most recently used agents shown; the filter reaches the rest
  const KEY_STORE = "agent-memory.dashboard.key";

  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";

  let key = sessionStorage.getItem(KEY_STORE) || "";
  let samples = []; // successive /metrics scrapes, oldest first, within WINDOW_S
  let agents = [];
  let modelName = null;
  let several = false; // several models served: an agent row names its model
  let timer = null;
  let generation = 0; // bumped on restart: answers to an older round are dropped
  let pendingDelete = null;
  let notice = null; // {text, until}: what an action reports, kept a few seconds

  class AuthError extends Error {}

  // -- the key ---------------------------------------------------------------------------

  function setKey(k) {
    key = k;
    if (k) sessionStorage.setItem(KEY_STORE, k);
    else sessionStorage.removeItem(KEY_STORE);
    $("forget").hidden = !k;
  }

  /** `#key=...` in the address: take it, then wipe it from the address bar and history. */
  function takeKeyFromFragment() {
    const m = /^#(?:.*&)?key=([^&]*)/.exec(location.hash);
    if (!m) return false;
    let k = m[1];
    try {
      k = decodeURIComponent(k);
    } catch (_) {
      /* not percent-encoded: as given */
    }
    history.replaceState(null, "", location.pathname + location.search);
    setKey(k.trim());
    return true;
  }

  async function api(path, options = {}) {
    const headers = new Headers();
    if (key) {
      if (/[^\x20-\xff]/.test(key)) throw new AuthError("This key has characters an HTTP header cannot carry.");
      headers.set("Authorization", "Bearer " + key);
    }
    const r = await fetch(path, { ...options, headers, cache: "no-store", credentials: "omit" });
    if (r.status === 401) throw new AuthError(key ? "The server refused this key." : "This server asks for an API key.");
    return r;
  }

  async function errorText(r) {
    try {
      const body = await r.json();
      return (body.error && body.error.message) || r.statusText;
    } catch (_) {
      return r.statusText || "HTTP " + r.status;
    }
  }

  // -- formatting ------------------------------------------------------------------------

  const numberFormat = new Intl.NumberFormat();
  const fmtInt = (n) => numberFormat.format(Math.round(n));

  function fmtBytes(b) {
    if (b < 1024) return `${Math.round(b)} B`;
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let i = -1;
    do {
      b /= 1024;
      i += 1;
    } while (b >= 1024 && i < units.length - 1);
    return `${b >= 100 ? b.toFixed(0) : b >= 10 ? b.toFixed(1) : b.toFixed(2)} ${units[i]}`;
  }

  const fmtPercent = (r) => `${(r * 100).toFixed(r > 0 && r < 0.1 ? 1 : 0)} %`;

  function fmtSeconds(s) {
    if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms`;
    return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  }

  function fmtAgo(seconds) {
    if (seconds < 2) return "just now";
    if (seconds < 90) return `${Math.round(seconds)} s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
    if (seconds < 129600) return `${Math.round(seconds / 3600)} h ago`;
    return `${Math.round(seconds / 86400)} days ago`;
  }

  const fmtSpan = (seconds) => (seconds < 90 ? `${Math.round(seconds)} s` : `${Math.round(seconds / 60)} min`);

  // -- /metrics ---------------------------------------------------------------------------

  /** Prometheus text format: [{name, labels, value}], comments skipped. */
  function parseMetrics(text) {
    const series = [];
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const m = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
        labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
      }
      const value = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : Number(m[3]);
      series.push({ name: m[1], labels, value });
    }
    return series;
  }

  function sampleOf(series, t) {
    const sum = (name, labels = {}) =>
      series
        .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
        .reduce((a, s) => a + s.value, 0);
    const ttft = "agent_memory_time_to_first_token_seconds";
    const buckets = series
      .filter((s) => s.name === ttft + "_bucket")
      .map((s) => [s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), s.value])
      .sort((a, b) => a[0] - b[0]);
    return {
      t,
      prompt: sum("agent_memory_prompt_tokens_total"),
      hot: sum("agent_memory_cached_tokens_total", { tier: "hot" }),
      warm: sum("agent_memory_cached_tokens_total", { tier: "warm" }),
      generated: sum("agent_memory_generated_tokens_total"),
      images: sum("agent_memory_prompt_images_total"),
      towered: sum("agent_memory_vision_images_total", { source: "tower" }),
      accepted: sum("agent_memory_speculation_accepted_tokens_total"),
      ttftSum: sum(ttft + "_sum"),
      ttftCount: sum(ttft + "_count"),
      buckets,
      prefilling: sum("agent_memory_sequences", { state: "prefilling" }),
      decoding: sum("agent_memory_sequences", { state: "decoding" }),
    };
  }

  function addSample(s) {
    const last = samples[samples.length - 1];
    // A counter that went down: the server restarted. Its history says nothing about now.
    if (last && (s.prompt < last.prompt || s.generated < last.generated || s.ttftCount < last.ttftCount)) samples = [];
    samples.push(s);
    while (samples.length > 2 && samples[1].t < s.t - WINDOW_S) samples.shift();
  }

  /** Estimated q-quantile from cumulative buckets [[le, count]], as Prometheus does. */
  function quantile(q, buckets) {
    const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
    if (!total) return null;
    const rank = q * total;
    let lower = 0;
    let below = 0;
    for (const [le, count] of buckets) {
      if (count >= rank) {
        if (le === Infinity) return { value: lower, over: true };
        return { value: lower + ((le - lower) * (rank - below)) / Math.max(count - below, 1e-9), over: false };
      }
      lower = le;
      below = count;
    }
    return null;
  }

  /** At each sample, fn(sample SMOOTH_S before, sample): [{t, v}], v null where undefined. */
  function trailing(fn) {
    const out = [];
    let j = 0;
    for (let i = 1; i < samples.length; i++) {
      while (j < i - 1 && samples[j + 1].t <= samples[i].t - SMOOTH_S) j += 1;
      out.push({ t: samples[i].t, v: fn(samples[j], samples[i]) });
    }
    return out;
  }

  /** The span the sparklines show: the window, or the history so far while it is shorter. */
  function shownSpan() {
    const n = samples.length;
    return n < 2 ? WINDOW_S : Math.min(WINDOW_S, Math.max(60, samples[n - 1].t - samples[0].t));
  }

  // -- sparklines ---------------------------------------------------------------------------

  function el(name, attrs = {}) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  }

  /** A line of points [{t, v}] over the window, gaps where v is null; fixed max or the data's. */
  function sparkline(box, points, { label, fmt, max = null }) {
    const W = 240;
    const H = 48;
    const now = samples.length ? samples[samples.length - 1].t : 0;
    const span = shownSpan();
    const values = points.filter((p) => p.v !== null).map((p) => p.v);
    const top = max !== null ? max : Math.max(...values, 0) * 1.1 || 1;
    const x = (t) => (W * (t - (now - span))) / span;
    const y = (v) => H - 2 - ((H - 4) * Math.min(v, top)) / top;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    svg.appendChild(el("line", { x1: 0, x2: W, y1: H - 1, y2: H - 1, class: "axis" }));
    let run = [];
    const flush = () => {
      if (run.length === 1) {
        svg.appendChild(el("circle", { cx: run[0][0], cy: run[0][1], r: 2, class: "dot" }));
      } else if (run.length > 1) {
        svg.appendChild(el("polyline", { points: run.map((p) => p.join(",")).join(" "), class: "line" }));
      }
      run = [];
    };
    for (const p of points) {
      if (p.v === null) flush();
      else run.push([x(p.t).toFixed(1), y(p.v).toFixed(1)]);
    }
    flush();
    const latest = [...points].reverse().find((p) => p.v !== null);
    const description = values.length
      ? `${label} over the last ${fmtSpan(span)}, each point the ${SMOOTH_S} s before it: latest ${fmt(latest.v)}, highest ${fmt(Math.max(...values))}`
      : `${label}: no data yet`;
    svg.setAttribute("aria-label", description);
    const title = el("title");
    title.textContent = description;
    svg.prepend(title);
    const scale = document.createElement("div");
    scale.className = "scale";
    scale.setAttribute("aria-hidden", "true"); // the svg's label says it
    scale.textContent = values.length ? `top of the scale: ${fmt(top)}` : "";
    box.replaceChildren(scale, svg);
  }

  // -- rendering ------------------------------------------------------------------------

  function setBar(bar, parts, budget, label) {
    const used = parts.reduce((a, p) => a + p.bytes, 0);
    const spans = bar.querySelectorAll(".seg");
    parts.forEach((p, i) => {
      spans[i].style.width = budget > 0 ? `${Math.min(100, (100 * p.bytes) / budget)}%` : "0";
    });
    bar.classList.toggle("over", budget > 0 && used > budget);
    bar.setAttribute("aria-label", budget > 0 ? `${label}: ${fmtBytes(used)} of ${fmtBytes(budget)}` : `${label}: off`);
  }

  function renderTotals(d) {
    const has = "hot_budget_bytes" in d;
    $("totals").hidden = !has;
    $("totals-none").hidden = has;
    if (!has) return;
    const hot = d.hot_bytes;
    const budget = d.hot_budget_bytes;
    $("hot-text").textContent = `${fmtBytes(hot)} of ${fmtBytes(budget)} (${fmtPercent(budget ? hot / budget : 0)})`;
    $("hot-exact").textContent = fmtBytes(d.hot_exact_bytes);
    $("hot-quantized").textContent = fmtBytes(d.hot_quantized_bytes);
    // Window and recurrent layers' snapshots (models that have them): shown only then.
    const snapshots = d.snapshot_hot_bytes || 0;
    $("hot-snapshots-key").hidden = !snapshots;
    $("hot-snapshots").textContent = fmtBytes(snapshots);
    setBar(
      $("hot-bar"),
      [{ bytes: d.hot_exact_bytes }, { bytes: d.hot_quantized_bytes }, { bytes: snapshots }],
      budget,
      "Hot memory",
    );
    const disk = d.disk_bytes;
    const diskBudget = d.disk_budget_bytes;
    $("disk-text").textContent = diskBudget
      ? `${fmtBytes(disk)} of ${fmtBytes(diskBudget)} (${fmtPercent(disk / diskBudget)})`
      : "off (no disk budget or no warm tier)";
    setBar($("disk-bar"), [{ bytes: disk }], diskBudget, "Disk");
    $("blocks").textContent =
      `Blocks: ${fmtInt(d.hot_blocks || 0)} hot, ${fmtInt(d.warm_blocks || 0)} warm, ${fmtInt(d.cold_blocks || 0)} cold` +
      " (a prefix that several agents share is one block).";
  }

  function renderRates() {
    const n = samples.length;
    if (n < 2) {
      for (const id of ["hit", "ttft", "gen", "batch"]) {
        $(`${id}-value`).textContent = "—";
        $(`${id}-detail`).textContent = "collecting…";
        $(`${id}-spark`).replaceChildren();
      }
      return;
    }
    const first = samples[0];
    const last = samples[n - 1];
    const span = `over ${fmtSpan(last.t - first.t)}`;
    $("window").textContent = fmtSpan(shownSpan());

    const prompt = last.prompt - first.prompt;
    const hot = last.hot - first.hot;
    const warm = last.warm - first.warm;
    $("hit-value").textContent = prompt > 0 ? fmtPercent((hot + warm) / prompt) : "—";
    $("hit-detail").textContent =
      prompt > 0
        ? `${fmtInt(hot + warm)} of ${fmtInt(prompt)} prompt tokens cached (memory ${fmtPercent(hot / prompt)}, disk ${fmtPercent(warm / prompt)}) ${span}`
        : `no prompts ${span}`;
    // Images (vision models): in prompts, and those the vision tower had to see (the rest came from memory).
    const images = last.images - first.images;
    const towered = last.towered - first.towered;
    if (images > 0) {
      $("hit-detail").textContent +=
        `; ${fmtInt(images)} image${images === 1 ? "" : "s"} in prompts, ${fmtInt(towered)} through the vision tower`;
    }
    const hitPoints = trailing((a, b) => (b.prompt > a.prompt ? (b.hot + b.warm - a.hot - a.warm) / (b.prompt - a.prompt) : null));
    sparkline($("hit-spark"), hitPoints, { label: "Cache hit ratio", fmt: fmtPercent, max: 1 });

    const count = last.ttftCount - first.ttftCount;
    if (count > 0) {
      const deltas = last.buckets.map(([le, c]) => {
        const before = first.buckets.find((b) => b[0] === le);
        return [le, c - (before ? before[1] : 0)];
      });
      const p90 = quantile(0.9, deltas);
      $("ttft-value").textContent = fmtSeconds((last.ttftSum - first.ttftSum) / count);
      $("ttft-detail").textContent =
        `mean of ${fmtInt(count)} requests ${span}` + (p90 ? `; p90 ${p90.over ? "over" : "≈"} ${fmtSeconds(p90.value)}` : "");
    } else {
      $("ttft-value").textContent = "—";
      $("ttft-detail").textContent = `no requests ${span}`;
    }
    const ttftPoints = trailing((a, b) => (b.ttftCount > a.ttftCount ? (b.ttftSum - a.ttftSum) / (b.ttftCount - a.ttftCount) : null));
    sparkline($("ttft-spark"), ttftPoints, { label: "Mean time to first token", fmt: fmtSeconds });

    const rate = (a, b) => (b.t > a.t ? (b.generated - a.generated) / (b.t - a.t) : null);
    const genPoints = trailing(rate);
    const genNow = genPoints[genPoints.length - 1].v;
    const fmtRate = (v) => v.toFixed(v < 10 ? 1 : 0);
    $("gen-value").textContent = genNow === null ? "—" : fmtRate(genNow);
    // Speculative decoding: the share of tokens that were accepted proposals (each a step saved).
    const made = last.generated - first.generated;
    const saved = made > 0 && last.accepted > first.accepted ? `; ${Math.round((100 * (last.accepted - first.accepted)) / made)} % accepted proposals` : "";
    $("gen-detail").textContent = `in the last ${SMOOTH_S} s; ${fmtRate(rate(first, last))} on average ${span}${saved}`;
    sparkline($("gen-spark"), genPoints, { label: "Generated tokens per second", fmt: fmtRate });

    $("batch-value").textContent = `${fmtInt(last.decoding)} decoding`;
    const peak = Math.max(...samples.map((s) => s.decoding));
    $("batch-detail").textContent = `${fmtInt(last.prefilling)} waiting or prefilling; at most ${fmtInt(peak)} decoding ${span}`;
    const batchPoints = samples.map((s) => ({ t: s.t, v: s.decoding }));
    sparkline($("batch-spark"), batchPoints, { label: "Sequences decoding", fmt: fmtInt });
  }

  const rows = new Map(); // rowKey(agent) -> {tr, cells}

  /** An agent of two models is two agents: a row each. */
  const rowKey = (a) => `${a.model}\u0000${a.id}`;

  /** `shown`: the id as the server escapes it (display_id), so that no control or bidi character
   * an older version let in hides in it or makes it pass for another; `id` goes in the URL. */
  function makeRow(id, shown, model) {
    const tr = document.createElement("tr");
    tr.dataset.agentId = id;
    const name = document.createElement("th");
    name.scope = "row";
    name.className = "id";
    name.textContent = shown;
    if (several) {
      const of = document.createElement("span");
      of.className = "of-model";
      of.textContent = ` · ${model}`;
      name.appendChild(of);
    }
    tr.appendChild(name);
    const cells = {};
    for (const k of ["tokens", "hot", "warm", "cold", "exact", "quantized", "disk"]) {
      cells[k] = document.createElement("td");
      cells[k].className = `num ${k}`;
      tr.appendChild(cells[k]);
    }
    cells.miss = document.createElement("td");
    cells.miss.className = "miss";
    tr.appendChild(cells.miss);
    const last = document.createElement("td");
    cells.last = document.createElement("time");
    last.appendChild(cells.last);
    tr.appendChild(last);
    const action = document.createElement("td");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "delete";
    button.textContent = "Delete";
    button.setAttribute("aria-label", `Delete agent ${shown}`);
    if (id === "." || id === "..") {
      // A browser folds a path segment of "." or ".." (encoded or not) into its parent.
      button.disabled = true;
      button.title = "A browser cannot name this id in a URL: curl --path-as-is -X DELETE …/v1/agents/" + id;
    } else {
      button.addEventListener("click", () => askDelete(id, shown));
    }
    action.appendChild(button);
    tr.appendChild(action);
    return { tr, cells };
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  function updateRow(row, a, now) {
    const c = row.cells;
    setText(c.tokens, fmtInt(a.tokens));
    setText(c.hot, fmtInt(a.blocks.hot || 0));
    setText(c.warm, fmtInt(a.blocks.warm || 0));
    setText(c.cold, fmtInt(a.blocks.cold || 0));
    const b = a.bytes;
    setText(c.exact, b.hot_exact ? fmtBytes(b.hot_exact) : "—");
    setText(c.quantized, b.hot_quantized ? fmtBytes(b.hot_quantized) : "—");
    setText(c.disk, b.disk ? fmtBytes(b.disk) : "—");
    const m = a.last_miss;
    setText(c.miss, m ? `${m.reason.replaceAll("_", " ")} at ${fmtInt(m.at)}` : "—");
    c.miss.title = m ? `${fmtInt(m.lost)} tokens the memory held not reused, ${fmtAgo(now - m.time)}` : "";
    const when = new Date(a.last_used * 1000);
    setText(c.last, fmtAgo(now - a.last_used));
    c.last.dateTime = when.toISOString();
    c.last.title = when.toLocaleString();
  }

  function renderAgents() {
    const now = Date.now() / 1000;
    const filter = $("filter").value.trim().toLowerCase();
    const sorted = [...agents].sort((a, b) => b.last_used - a.last_used || (a.id < b.id ? -1 : 1));
    const matching = filter ? sorted.filter((a) => a.display_id.toLowerCase().includes(filter)) : sorted;
    const shown = matching.slice(0, MAX_ROWS);
    const tbody = $("agents").tBodies[0];
    const focused = document.activeElement;

    const keep = new Set(shown.map(rowKey));
    for (const [key, row] of rows) {
      if (!keep.has(key)) {
        row.tr.remove();
        rows.delete(key);
      }
    }
    shown.forEach((a, i) => {
      let row = rows.get(rowKey(a));
      if (!row) rows.set(rowKey(a), (row = makeRow(a.id, a.display_id, a.model)));
      updateRow(row, a, now);
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] || null);
    });
    if (focused && focused !== document.activeElement && document.contains(focused)) focused.focus({ preventScroll: true });

    setText($("agent-count"), `(${fmtInt(agents.length)})`);
    $("agents-empty").hidden = agents.length > 0;
    const more = $("agents-more");
    more.hidden = matching.length <= shown.length && !(filter && matching.length < agents.length);
    more.textContent =
      matching.length > shown.length
        ? `Showing the ${fmtInt(shown.length)} most recently used of ${fmtInt(matching.length)}; filter to find others.`
        : `${fmtInt(matching.length)} of ${fmtInt(agents.length)} agents match the filter.`;
  }

  function renderHealth(h) {
    const health = $("health");
    health.textContent = h.status === "ok" ? "ok" : `${h.status}${h.message ? ": " + h.message : ""}`;
    health.className = h.status === "ok" ? "ok" : "bad";
    if (h.kv) setText($("kv"), kvText(h.kv));
    several = Boolean(h.models && h.models.length > 1);
    if (several) {
      // Several models load on demand: which are in memory now.
      modelName = h.models.map((m) => `${m.id} (${m.loaded ? "loaded" : "not loaded"})`).join(", ");
      setText($("model"), modelName);
    }
  }

  /** The precisions as the memory bar counts them: exact while hot, quantized once cooled. */
  function kvText(kv) {
    const name = (tag) => (tag === "kv16" ? "unquantized" : tag);
    const hot = kv.working !== kv.hot ? `exact while hot, ${name(kv.hot)} once cooled` : `${name(kv.hot)} in memory`;
    return `${hot}; ${name(kv.disk)} on disk`;
  }

  function showStatus(text, isError = false) {
    const s = $("status");
    setText(s, text);
    s.className = isError ? "error" : "";
  }

  function showKeyForm(why) {
    $("data").hidden = true;
    clearData();
    $("keyform").hidden = false;
    $("key-why").textContent = why;
    showStatus("");
  }

  function clearData() {
    for (const id of ["model", "kv", "health"]) $(id).textContent = "—";
    $("health").className = "";
    $("updated").textContent = "never";
    modelName = null;
    agents = [];
    samples = [];
    for (const row of rows.values()) row.tr.remove();
    rows.clear();
  }

  // -- the refresh loop -------------------------------------------------------------------

  async function refresh(round) {
    try {
      const healthReq = fetch("/health", { cache: "no-store", credentials: "omit" })
        .then((r) => r.json())
        .catch(() => null);
      const [agentsR, metricsR] = await Promise.all([api("/v1/agents"), api("/metrics")]);
      if (round !== generation) return;
      const health = await healthReq;
      if (health) renderHealth(health);
      if (!agentsR.ok) {
        showStatus(`Agents: ${await errorText(agentsR)}`, agentsR.status !== 503);
        return;
      }
      const listing = await agentsR.json();
      if (round !== generation) return;
      $("keyform").hidden = true;
      $("data").hidden = false;
      agents = listing.data;
      renderTotals(listing);
      renderAgents();
      // /metrics is the operator's: a tenant's key sees its own totals above, no server-wide rates.
      const operator = metricsR.status !== 403;
      $("rates-title").parentElement.hidden = !operator;
      if (metricsR.ok) {
        addSample(sampleOf(parseMetrics(await metricsR.text()), Date.now() / 1000));
        renderRates();
      }
      if (modelName === null && !several) {
        const m = await api("/v1/models");
        if (m.ok) modelName = ((await m.json()).data || []).map((x) => x.id).join(", ");
        setText($("model"), modelName || "—");
      }
      setText($("updated"), new Date().toLocaleTimeString());
      if (!metricsR.ok && operator) showStatus(`Metrics: ${await errorText(metricsR)}`, true);
      else showStatus(notice && Date.now() < notice.until ? notice.text : "");
    } catch (e) {
      if (round !== generation) return;
      if (e instanceof AuthError) {
        const refused = Boolean(key);
        setKey("");
        showKeyForm(refused ? `${e.message} Enter the key again.` : e.message);
        if (!refused) $("key-input").focus();
        throw e; // stops the loop until a key is given
      }
      showStatus(`Server unreachable (${e.message}); retrying every ${REFRESH_MS / 1000} s.`, true);
    }
  }

  async function tick(round) {
    if (round !== generation) return;
    try {
      if (!document.hidden) await refresh(round);
    } catch (e) {
      return; // waiting for a key
    }
    if (round === generation) timer = setTimeout(() => tick(round), REFRESH_MS);
  }

  function restart() {
    generation += 1;
    clearTimeout(timer);
    tick(generation);
  }

  // -- deleting -------------------------------------------------------------------------

  function askDelete(id, shown) {
    pendingDelete = { id, shown };
    $("confirm-id").textContent = shown;
    $("confirm-error").textContent = "";
    $("confirm-delete").disabled = false;
    $("confirm").showModal();
  }

  async function confirmDelete() {
    const { id, shown } = pendingDelete;
    const button = $("confirm-delete");
    button.disabled = true;
    try {
      const r = await api("/v1/agents/" + encodeURIComponent(id), { method: "DELETE" });
      if (!r.ok && r.status !== 404) {
        $("confirm-error").textContent = `Not deleted: ${await errorText(r)}`;
        button.disabled = false;
        return;
      }
      $("confirm").close();
      agents = agents.filter((a) => a.id !== id);
      renderAgents();
      $("agents-title").focus();
      notice = { text: r.ok ? `Agent ${shown} deleted.` : `Agent ${shown} was already gone.`, until: Date.now() + 8000 };
      showStatus(notice.text);
      restart();
    } catch (e) {
      $("confirm-error").textContent = e instanceof AuthError ? e.message : `Not deleted: ${e.message}`;
      button.disabled = false;
    }
  }

  // -- start ----------------------------------------------------------------------------

  $("forget").hidden = !key;
  $("agents-title").tabIndex = -1;
  $("key").addEventListener("submit", (e) => {
    e.preventDefault();
    setKey($("key-input").value.trim());
    $("key-input").value = "";
    restart();
  });
  $("forget").addEventListener("click", () => {
    setKey("");
    clearData();
    $("data").hidden = true;
    restart();
  });
  $("filter").addEventListener("input", renderAgents);
  $("confirm-cancel").addEventListener("click", () => $("confirm").close());
  $("confirm-delete").addEventListener("click", confirmDelete);
  window.addEventListener("hashchange", () => {
    if (takeKeyFromFragment()) restart();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) restart();
  });
  takeKeyFromFragment();
  restart();
})();
