// Cairn's web view: threads, summary trees, search, context preview and a timeline, over the
// REST API of `cairn serve`. Read-only. The API key lives in this tab's session storage and
// goes with every /v1 call; a link may carry it in its fragment (#key=...), which never
// leaves the browser and is removed from the address bar at once.
"use strict";

const state = { key: sessionStorage.getItem("cairnKey") || "", thread: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function status(text, isError) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = isError ? "error" : "";
}

async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Bearer " + state.key } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const data = await r.json().catch(() => ({}));
  if (!r.ok) {
    const msg = (data.error && data.error.message) || r.statusText;
    throw new Error(r.status + ": " + msg);
  }
  return data;
}

const day = (t) => (t || "").slice(0, 10);
// The speaker's name, unless the text already starts with it (imports often keep "Name: ").
const who = (name, text) =>
  name && !text.startsWith(name + ":") ? el("span", { class: "who" }, name + ": ") : null;
// The other days a recalled line's words were said on (its repeats may hold several turns of
// one day, and of its own day: the day is named once).
const alsoOn = (i) => [...new Set((i.repeats || []).map((r) => day(r.created_at)))].filter((d) => d !== day(i.created_at));
const firstLines = (text, n) => text.split("\n").slice(0, n || 2).join("\n");

function span(m) {
  if (m.summary) {
    const a = day(m.summary.time_range_start), b = day(m.summary.time_range_end);
    return a === b ? a : a + " → " + b;
  }
  return m.created_at.slice(0, 16).replace("T", " ");
}

// ---- threads ----------------------------------------------------------------------------

async function loadThreads() {
  const list = document.getElementById("threads");
  list.replaceChildren();
  const data = await api("GET", "/v1/threads");
  for (const t of data.threads) {
    const b = el("button", { dataset: { thread: t.id }, onclick: () => selectThread(t.id) },
      t.id, el("span", { class: "count" }, t.memories + " · " + t.summaries + "Σ"));
    list.append(el("li", {}, b));
  }
  status(data.threads.length + " thread(s)");
  return data.threads;
}

async function selectThread(id) {
  state.thread = id;
  for (const b of document.querySelectorAll("#threads button")) {
    b.classList.toggle("selected", b.dataset.thread === id);
  }
  document.getElementById("tree-thread").textContent = id;
  await Promise.all([loadTree(id), loadTimeline(id)]);
}

// ---- summary tree -----------------------------------------------------------------------

function nodeFor(m) {
  const hasSources = !!(m.summary && m.summary.source_ids.length);
  const children = el("ul", { class: "children" });
  const toggle = el("button", { class: "toggle", title: "sources", "aria-expanded": "false" },
    hasSources ? "▸" : "·");
  if (!hasSources) toggle.disabled = true;
  const li = el("li", { class: "node", dataset: { id: m.id, level: String(m.level) } },
    el("div", { class: "row" }, toggle,
      el("span", { class: "lvl l" + Math.min(m.level, 1) }, "L" + m.level),
      el("span", { class: "when" }, span(m)),
      who(m.speaker, m.content),
      el("span", { class: "text" }, m.level > 0 ? firstLines(m.content, 2) : m.content)),
    children);
  toggle.addEventListener("click", () => toggleNode(li, toggle, children));
  return li;
}

async function toggleNode(li, toggle, children) {
  if (toggle.getAttribute("aria-expanded") === "true") {
    children.replaceChildren();
    toggle.setAttribute("aria-expanded", "false");
    toggle.textContent = "▸";
    return;
  }
  const data = await api("GET", "/v1/summaries/" + li.dataset.id + "/sources");
  children.replaceChildren(...data.memories.map(nodeFor));
  toggle.setAttribute("aria-expanded", "true");
  toggle.textContent = "▾";
  li.classList.add("expanded");
}

async function loadTree(thread) {
  const tree = document.getElementById("tree");
  tree.replaceChildren();
  const data = await api("GET", "/v1/threads/" + encodeURIComponent(thread) + "/tree?depth=0");
  if (!data.trees.length) {
    tree.append(el("li", { class: "muted" }, "No summaries yet: run a consolidation."));
  }
  for (const t of data.trees) tree.append(nodeFor(t.memory));
}

// ---- timeline ---------------------------------------------------------------------------

async function loadTimeline(thread) {
  const box = document.getElementById("timeline");
  box.replaceChildren();
  const data = await api("GET", "/v1/threads/" + encodeURIComponent(thread) + "/timeline");
  if (!data.days.length) return;
  const t0 = Date.parse(data.days[0].day), t1 = Date.parse(data.days[data.days.length - 1].day);
  const spanMs = Math.max(t1 - t0, 86400000);
  const levels = Math.max(0, ...data.spans.map((s) => s.level));
  const W = 900, barH = 80, rowH = 14, pad = 30;
  const H = barH + 20 + levels * (rowH + 4) + 20;
  const x = (t) => pad + ((t - t0) / spanMs) * (W - 2 * pad);
  const maxTurns = Math.max(...data.days.map((d) => d.turns));
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", "100%");
  const add = (tag, attrs, title) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (title) {
      const t = document.createElementNS(NS, "title");
      t.textContent = title;
      e.append(t);
    }
    svg.append(e);
    return e;
  };
  for (const d of data.days) {
    const h = (d.turns / maxTurns) * barH;
    add("rect", { class: "day", x: x(Date.parse(d.day)) - 2, y: barH - h + 10, width: 4, height: h, fill: "#4a79a8" },
      d.day + ": " + d.turns + " turns");
  }
  const colors = ["#7aa37a", "#c5953f", "#a45d8c", "#4f8f9c", "#8a6d3b"];
  for (const s of data.spans) {
    const y = barH + 20 + (s.level - 1) * (rowH + 4);
    const a = x(Date.parse(s.start)), b = x(Date.parse(s.end));
    add("rect", { class: "span", x: a, y, width: Math.max(b - a, 2), height: rowH, rx: 3,
      fill: colors[(s.level - 1) % colors.length], "fill-opacity": 0.55 },
      "L" + s.level + " " + s.start.slice(0, 10) + " → " + s.end.slice(0, 10));
  }
  for (let l = 1; l <= levels; l++) {
    const t = add("text", { x: 2, y: barH + 20 + (l - 1) * (rowH + 4) + rowH - 3, "font-size": 10, fill: "#5f6b7a" });
    t.textContent = "L" + l;
  }
  const lab = (t, anchor, xx) => {
    const e = add("text", { x: xx, y: H - 4, "font-size": 10, fill: "#5f6b7a", "text-anchor": anchor });
    e.textContent = t;
  };
  lab(data.days[0].day, "start", pad);
  lab(data.days[data.days.length - 1].day, "end", W - pad);
  box.append(svg);
}

// ---- search -----------------------------------------------------------------------------

async function expandInPlace(into, id) {
  const data = await api("GET", "/v1/summaries/" + id + "/sources");
  const box = el("div", { class: "expansion", dataset: { of: id } },
    ...data.memories.map((m) => el("div", { class: "source", dataset: { id: m.id } },
      el("span", { class: "lvl l" + Math.min(m.level, 1) }, "L" + m.level), " ",
      el("span", { class: "when" }, span(m)), " ",
      who(m.speaker, m.content),
      el("span", { class: "text" }, m.level > 0 ? firstLines(m.content, 2) : m.content))));
  const old = into.querySelector(".expansion");
  if (old) old.remove();
  into.append(box);
  return box;
}

async function search(q, mode) {
  const out = document.getElementById("hits");
  out.replaceChildren();
  const body = { query: q, mode, k: 10 };
  if (document.getElementById("in-thread").checked && state.thread) body.thread = state.thread;
  const data = await api("POST", "/v1/search", body);
  status(data.hits.length + " hit(s)");
  for (const h of data.hits) {
    const chips = el("div", { class: "chips" });
    const hit = el("div", { class: "hit", dataset: { id: h.id, level: String(h.level) } },
      el("div", { class: "row" },
        el("span", { class: "lvl l" + Math.min(h.level, 1) }, "L" + h.level),
        el("span", { class: "when" }, h.created_at.slice(0, 16).replace("T", " ")),
        el("span", { class: "score" }, h.score.toFixed(3) + " · " + h.kind)),
      el("div", {}, who(h.speaker, h.content), el("span", { class: "text" }, firstLines(h.content, 3))),
      chips);
    if (h.level > 0) {
      chips.append(el("button", { class: "chip expand", onclick: () => expandInPlace(hit, h.id) }, "expand sources"));
    }
    out.append(hit);
    // Its summary ancestors (back-links), each expandable in place.
    api("GET", "/v1/memories/" + h.id + "/ancestors").then((a) => {
      for (const s of a.memories) {
        chips.append(el("button", { class: "chip ancestor", dataset: { id: s.id },
          title: firstLines(s.content, 3), onclick: () => expandInPlace(hit, s.id) },
          "in L" + s.level + " · " + span(s)));
      }
      hit.dataset.ancestors = String(a.memories.length);
    }).catch((e) => status(e.message, true));
  }
  return data.hits;
}

// ---- context ----------------------------------------------------------------------------

async function preview(q, budget) {
  const out = document.getElementById("context");
  out.replaceChildren();
  if (!state.thread) throw new Error("choose a thread first");
  const c = await api("POST", "/v1/context", { thread: state.thread, query: q, budget });
  out.append(el("div", { class: "tokens" }, c.tokens + " of " + c.budget + " tokens"));
  for (const section of ["summary", "related", "recalled", "recent"]) {
    const items = c.items.filter((i) => i.section === section);
    if (!items.length) continue;
    const tokens = items.reduce((n, i) => n + i.tokens, 0);
    out.append(el("div", { class: "section-title" }, section + " — " + items.length + " item(s), " + tokens + " tokens"));
    for (const i of items) {
      out.append(el("div", { class: "item", dataset: { section, id: i.id } },
        el("span", { class: "tokens" }, i.tokens + " tok · " + i.created_at.slice(0, 10) + " "),
        who(i.speaker, i.content),
        el("span", { class: "text" }, i.content),
        alsoOn(i).length ? el("span", { class: "tokens" }, " (also on " + alsoOn(i).join(", ") + ")") : []));
    }
  }
}

// ---- wiring -----------------------------------------------------------------------------

function guard(f) {
  return async (...args) => {
    try {
      return await f(...args);
    } catch (e) {
      status(e.message, true);
      document.body.dataset.error = e.message;
      throw e;
    }
  };
}

document.getElementById("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.key = document.getElementById("key").value.trim();
  sessionStorage.setItem("cairnKey", state.key);
  guard(loadThreads)().catch(() => {});
});
document.getElementById("forget").addEventListener("click", () => {
  sessionStorage.removeItem("cairnKey");
  state.key = "";
  document.getElementById("threads").replaceChildren();
  status("key forgotten");
});
document.getElementById("search-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  guard(search)(document.getElementById("q").value, document.getElementById("mode").value).catch(() => {});
});
document.getElementById("context-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  guard(preview)(document.getElementById("cq").value, Number(document.getElementById("budget").value)).catch(() => {});
});

// A link may open a view: #key=K&thread=T&open=1&q=QUERY&mode=hybrid&context=QUESTION.
// `open` expands the first summary; with `q`, the first hit's first ancestor is expanded.
async function start() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.get("key")) {
    state.key = p.get("key");
    sessionStorage.setItem("cairnKey", state.key);
    p.delete("key");
    history.replaceState(null, "", location.pathname + (p.toString() ? "#" + p : ""));
  }
  if (!state.key) {
    status("enter an API key");
    return;
  }
  document.getElementById("key").value = state.key;
  const threads = await loadThreads();
  const thread = p.get("thread") || (threads[0] && threads[0].id);
  if (!thread) return;
  await selectThread(thread);
  if (p.get("open")) {
    const li = document.querySelector("#tree li.node");
    if (li) await toggleNode(li, li.querySelector(".toggle"), li.querySelector(".children"));
  }
  if (p.get("q")) {
    document.getElementById("q").value = p.get("q");
    if (p.get("mode")) document.getElementById("mode").value = p.get("mode");
    const hits = await search(p.get("q"), document.getElementById("mode").value);
    if (hits.length) {
      const hit = document.querySelector("#hits .hit");
      const a = await api("GET", "/v1/memories/" + hits[0].id + "/ancestors");
      const target = a.memories.length ? a.memories[0].id : (hits[0].level > 0 ? hits[0].id : null);
      if (target) await expandInPlace(hit, target);
    }
  }
  if (p.get("context")) {
    document.getElementById("cq").value = p.get("context");
    await preview(p.get("context"), Number(document.getElementById("budget").value));
  }
}

guard(start)()
  .then(() => { document.body.dataset.ready = "1"; })
  .catch(() => { document.body.dataset.ready = "error"; });
