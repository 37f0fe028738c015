// A client of farm's HTTP API in plain Node.js (>= 18: fetch, no packages): opens a session,
// runs two cells that share a variable, reads a run's server-sent events, closes the session.
// Usage: node client.mjs http://127.0.0.1:8080 "$FARM_TOKEN"; prints one JSON line.
const [base, token] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${token}`, "Content-Type": "application/json" };

async function call(method, path, body, extra = {}) {
  const response = await fetch(`${base}/v1${path}`, {
    method,
    headers: { ...headers, ...extra },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok && response.status !== 204) {
    throw new Error(`${method} ${path}: ${response.status} ${await response.text()}`);
  }
  return response;
}

// Each SSE event: "event: NAME" and "data: JSON" lines, ended by a blank line.
async function* events(response) {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of response.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const name = /^event: (.*)$/m.exec(block)?.[1] ?? "message";
      const data = /^data: (.*)$/m.exec(block)?.[1];
      if (data !== undefined) yield { name, data: JSON.parse(data) };
    }
  }
}

const session = await (await call("POST", "/sessions", { image: "default" })).json();
const path = `/sessions/${session.id}`;
try {
  const first = await (await call("POST", `${path}/run`, { code: "x = 6" })).json();
  const second = await (await call("POST", `${path}/run`, { code: "x * 7" })).json();
  const streamed = await call(
    "POST",
    `${path}/run`,
    { code: "for i in range(3): print('tick', i)\nx * 100" },
    { Accept: "text/event-stream" },
  );
  const seen = [];
  let stdout = "";
  let result = null;
  for await (const { name, data } of events(streamed)) {
    seen.push(name);
    if (name === "stream") stdout += data.text;
    if (name === "done") result = data;
  }
  console.log(
    JSON.stringify({
      session: session.id,
      first: first.status,
      second: second.value.text,
      events: seen,
      stdout,
      result: result.value.text,
    }),
  );
} finally {
  await call("DELETE", path);
}
