// paradec's chat page: multi-turn chat over the server's own OpenAI route, every token coloured by
// how it was committed (the stream's `paradec` trace: an accepted draft token and its drafter, the
// target's bonus token, a plain `ar` step), tau, tokens/s and acceptance by depth as tokens arrive,
// and a race of `ar` against the chosen method. Model text is only ever set as textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { messages: [], key: sessionStorage.getItem("paradec-key") || "", model: "", busy: false };

async function api(path, options = {}) {
  for (;;) {
    const headers = { "Content-Type": "application/json", ...(options.headers || {}) };
    if (state.key) headers.Authorization = "Bearer " + state.key;
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    state.key = await askKey();
    sessionStorage.setItem("paradec-key", state.key);
  }
}

function askKey() {
  return new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-form").onsubmit = () => resolve($("key").value);
    dialog.showModal();
  });
}

async function loadInfo() {
  const info = await (await api("/paradec/info")).json();
  state.model = info.model;
  $("model").textContent = info.model;
  const select = $("method");
  select.replaceChildren();
  for (const name of info.methods) {
    const option = document.createElement("option");
    option.value = option.textContent = name;
    option.selected = name === info.default_method;
    select.appendChild(option);
  }
}

// ---- one streamed answer -----------------------------------------------------------------------
class Answer {
  constructor(container, method) {
    this.container = container;
    this.method = method;
    this.text = "";
    this.tokens = 0;
    this.steps = new Set();
    this.offered = [];
    this.reached = [];
    this.drafters = {};
    this.start = performance.now();
    this.seconds = 0;
    this.usage = null;
  }

  // one chunk: its text (may be empty: held back) and, when traced, how its token was committed
  add(text, trace) {
    const span = document.createElement("span");
    span.className = "tok";
    if (trace) {
      span.classList.add(trace.kind);
      if (trace.kind === "draft") span.classList.add("d-" + trace.drafter.replace(/[^a-z0-9]/gi, ""));
      span.title = `pass ${trace.step}: ${trace.kind}` + (trace.drafted ? ` (${trace.drafter}: ${trace.accepted} of ${trace.drafted} drafted accepted)` : "");
      this.tokens += 1;
      if (!this.steps.has(trace.step)) {
        this.steps.add(trace.step);
        const name = trace.drafted ? trace.drafter : "ar";
        this.drafters[name] = (this.drafters[name] || 0) + 1;
        for (let d = 0; d < trace.depth; d++) {
          this.offered[d] = (this.offered[d] || 0) + 1;
          if (d < trace.accepted) this.reached[d] = (this.reached[d] || 0) + 1;
        }
      }
    }
    span.textContent = text;
    this.container.appendChild(span);
    this.text += text;
    this.seconds = (performance.now() - this.start) / 1000;
  }

  get tau() {
    if (this.usage && this.usage.paradec) return this.usage.paradec.tau;
    return this.steps.size ? this.tokens / this.steps.size : 0;
  }
}

async function stream(messages, method, answer, onUpdate) {
  const body = {
    model: state.model,
    messages,
    method,
    stream: true,
    trace: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  const response = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body) });
  if (!response.ok) {
    const error = await response.json().catch(() => ({}));
    throw new Error((error.error && error.error.message) || response.statusText);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 2);
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      const chunk = JSON.parse(line.slice(6));
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) answer.usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      const content = choice && choice.delta && choice.delta.content;
      if (chunk.paradec || content) answer.add(content || "", chunk.paradec);
      onUpdate(answer);
    }
  }
  answer.seconds = (performance.now() - answer.start) / 1000;
  onUpdate(answer);
  return answer;
}

// ---- the side panel ----------------------------------------------------------------------------
function showStats(answer) {
  $("s-method").textContent = answer.method;
  $("s-tokens").textContent = String(answer.tokens);
  $("s-steps").textContent = String(answer.steps.size);
  const tau = $("s-tau");
  tau.textContent = answer.tau ? answer.tau.toFixed(2) : "-";
  tau.dataset.value = String(answer.tau);
  $("s-tps").textContent = answer.seconds ? (answer.tokens / answer.seconds).toFixed(1) : "-";
  const rows = answer.offered.map((n, d) => {
    const tr = document.createElement("tr");
    for (const cell of [d + 1, n, ((100 * (answer.reached[d] || 0)) / n).toFixed(0) + " %"]) {
      const td = document.createElement("td");
      td.textContent = String(cell);
      tr.appendChild(td);
    }
    return tr;
  });
  $("depths").tBodies[0].replaceChildren(...rows);
  const items = Object.entries(answer.drafters).sort((a, b) => b[1] - a[1]).map(([name, n]) => {
    const li = document.createElement("li");
    li.textContent = `${name}: ${n} passes`;
    return li;
  });
  $("drafters").replaceChildren(...items);
}

function turn(role, text) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role;
  const body = document.createElement("div");
  body.className = "answer";
  if (text !== undefined) body.textContent = text;
  div.append(who, body);
  $("turns").appendChild(div);
  return body;
}

function fail(container, error) {
  const p = document.createElement("p");
  p.className = "error";
  p.textContent = String(error.message || error);
  container.appendChild(p);
}

async function send(event) {
  if (event) event.preventDefault();
  const prompt = $("prompt").value;
  if (!prompt.trim() || state.busy) return;
  state.busy = true;
  $("prompt").value = "";
  state.messages.push({ role: "user", content: prompt });
  turn("user", prompt);
  const body = turn("assistant");
  body.parentElement.classList.add("streaming");
  const answer = new Answer(body, $("method").value);
  try {
    await stream(state.messages, answer.method, answer, showStats);
    state.messages.push({ role: "assistant", content: answer.text });
  } catch (error) {
    state.messages.pop();
    fail(body, error);
  } finally {
    body.parentElement.classList.remove("streaming");
    body.parentElement.classList.add("done");
    state.busy = false;
  }
}

// ---- the race: ar and the chosen method, one after the other, each alone on the server ---------
let races = 0;
async function race() {
  // the prompt box's text after the chat so far, or else the last question asked again
  let history = state.messages;
  let prompt = $("prompt").value.trim();
  if (!prompt) {
    const last = history.map((m) => m.role).lastIndexOf("user");
    if (last < 0) return;
    prompt = history[last].content;
    history = history.slice(0, last);
  }
  if (state.busy) return;
  state.busy = true;
  const method = $("method").value;
  const messages = [...history, { role: "user", content: prompt }];
  $("race-result").hidden = false;
  $("lane-b-title").textContent = method;
  const lanes = { ar: ["lane-a", "lane-a-time"], [method]: ["lane-b", "lane-b-time"] };
  for (const [box, time] of Object.values(lanes)) {
    $(box).replaceChildren();
    $(time).textContent = "waiting";
  }
  // the order alternates from race to race, so a machine that drifts favours neither
  const order = races++ % 2 ? [method, "ar"] : ["ar", method];
  const done = {};
  try {
    for (const name of order) {
      const [box, time] = lanes[name];
      const answer = new Answer($(box), name);
      $(time).textContent = "decoding";
      await stream(messages, name, answer, (a) => {
        $(time).textContent = `${a.tokens} tokens, ${a.seconds.toFixed(2)} s`;
      });
      done[name] = answer;
      $(time).textContent = `finished in ${answer.seconds.toFixed(2)} s, ${(answer.tokens / answer.seconds).toFixed(1)} tokens/s, tau ${answer.tau.toFixed(2)}`;
    }
    const speedup = done.ar.seconds / done[method].seconds;
    $("lane-b-time").textContent += ` (${speedup.toFixed(2)}x ar)`;
  } catch (error) {
    fail($("race-result"), error);
  } finally {
    state.busy = false;
  }
}

function reset() {
  state.messages = [];
  $("turns").replaceChildren();
}

$("ask").addEventListener("submit", send);
$("race").addEventListener("click", race);
$("reset").addEventListener("click", reset);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) send(event);
});
window.paradec = { state, Answer, turn };
loadInfo().catch((error) => fail($("turns"), error));
