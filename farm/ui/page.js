"use strict";
// The page: workers and sessions are polled; the chosen session's journal is followed with
// server-sent events, each carrying a mime_stream dict and its safe HTML fragment.
let source = null;
let current = null;

function text(tag, value) {
  const el = document.createElement(tag);
  el.textContent = value;
  return el;
}

async function refresh() {
  try {
    const [workers, sessions] = await Promise.all([
      fetch("/api/workers").then((r) => r.json()),
      fetch("/api/sessions").then((r) => r.json()),
    ]);
    const body = document.querySelector("#workers tbody");
    body.replaceChildren(...workers.map((w) => {
      const row = document.createElement("tr");
      row.append(text("td", w.id), text("td", w.image), text("td", w.ready ? "yes" : "no"),
                 text("td", `${w.sessions}/${w.capacity}`));
      return row;
    }));
    const list = document.getElementById("sessions");
    list.replaceChildren(...sessions.map((s) => {
      const item = document.createElement("li");
      if (s.live) item.className = "live";
      const link = text("a", s.id);
      link.href = `#session=${s.id}`;
      if (s.id === current) link.className = "current";
      item.append(link);
      return item;
    }));
    document.getElementById("status").textContent =
      `${workers.length} workers, ${sessions.length} sessions`;
  } catch (err) {
    document.getElementById("status").textContent = `offline (${err})`;
  }
}

function follow(sessionId) {
  if (source) source.close();
  current = sessionId;
  const transcript = document.getElementById("transcript");
  transcript.replaceChildren();
  document.getElementById("title").textContent = `Session ${sessionId}`;
  source = new EventSource(`/api/sessions/${encodeURIComponent(sessionId)}/events`);
  source.onmessage = (message) => {
    const item = JSON.parse(message.data);
    const holder = document.createElement("div");
    holder.innerHTML = item.html; // built server-side from escaped, sandboxed parts
    transcript.append(...holder.childNodes);
  };
}

function route() {
  const match = location.hash.match(/session=([\w-]+)/);
  if (match && match[1] !== current) follow(match[1]);
}

window.addEventListener("hashchange", route);
route();
refresh();
setInterval(refresh, 2000);
