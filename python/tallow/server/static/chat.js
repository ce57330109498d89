// The chat page of `tallow serve`: a conversation with the server's model over its own
// OpenAI-compatible API (/v1/chat/completions, streamed), kept in the browser's local storage.

import { renderMarkdown } from "./markdown.js";

const STORE = "tallow-chat";
const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "seed", "api_key"];
const $ = (id) => document.getElementById(id);

// messages: [{role: "user" | "assistant", content, stats}]; an assistant's stats say how its
// answer ended: {state: "done", tokens, speed} | {state: "stopped", seconds} |
// {state: "error", error} | {state: "streaming"}.
const state = load();
let model = null;
let running = null; // the AbortController of the answer that streams

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) ?? "null");
    if (saved && Array.isArray(saved.messages)) {
      // An answer that was streaming when the page went away ended there.
      for (const m of saved.messages) {
        if (m.stats?.state === "streaming") m.stats = { state: "stopped", seconds: 0 };
      }
      return { messages: saved.messages, settings: saved.settings ?? {} };
    }
  } catch {
    // unreadable: start afresh
  }
  return { messages: [], settings: {} };
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(state));
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

// -- the conversation ---------------------------------------------------------------------------

function statsText(stats) {
  switch (stats?.state) {
    case undefined:
      return "";
    case "streaming":
      return "…";
    case "stopped":
      return "stopped";
    case "error":
      return `error: ${stats.error}`;
    default:
      return `${stats.tokens} tokens · ${stats.speed.toFixed(1)} tok/s`;
  }
}

function messageView(message) {
  const box = el("article", null, `message ${message.role}`);
  box.append(el("div", message.role === "user" ? "You" : "Assistant", "role"));
  box.append(el("div", null, "content"), el("div", null, "stats"));
  showMessage(box, message);
  return box;
}

function showMessage(box, message) {
  const content = box.querySelector(".content");
  if (message.role === "assistant") renderMarkdown(message.content, content);
  else content.textContent = message.content;
  box.querySelector(".stats").textContent = statsText(message.stats);
  box.dataset.state = message.stats?.state ?? "done";
}

function showAll() {
  $("messages").replaceChildren(...state.messages.map(messageView));
  scrollDown(true);
}

function scrollDown(always) {
  const near = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  if (always || near) window.scrollTo(0, document.body.scrollHeight);
}

// -- the server ---------------------------------------------------------------------------------

function headers() {
  const out = { "content-type": "application/json" };
  const key = state.settings.api_key;
  if (key) out.authorization = `Bearer ${key}`;
  return out;
}

async function failure(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `HTTP ${response.status}`;
  }
}

function showError(message) {
  $("error").textContent = message ?? "";
  $("error").hidden = !message;
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw new Error(await failure(response));
    model = (await response.json()).data[0].id;
    $("model").textContent = model;
    showError(null);
  } catch (e) {
    model = null;
    $("model").textContent = "no model";
    showError(`The server's model is unknown: ${e.message}`);
  }
}

// The server-sent events of a streamed answer, parsed.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        yield JSON.parse(line.slice(6));
      }
    }
  }
}

function number(id, parse) {
  const value = parse(state.settings[id] ?? $(id).value);
  return Number.isFinite(value) ? value : undefined;
}

function requestBody(history) {
  const messages = [];
  const system = state.settings.system ?? "";
  if (system.trim()) messages.push({ role: "system", content: system });
  for (const m of history) {
    if (m.content && m.stats?.state !== "error") messages.push({ role: m.role, content: m.content });
  }
  return {
    model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: number("temperature", parseFloat),
    top_p: number("top_p", parseFloat),
    max_tokens: number("max_tokens", (v) => parseInt(v, 10)),
    seed: number("seed", (v) => parseInt(v, 10)),
  };
}

async function send(text) {
  if (model === null) await loadModel();
  if (model === null) return; // the message stays in the box; the error says why
  $("input").value = "";
  const body = requestBody([...state.messages, { role: "user", content: text }]);
  const answer = { role: "assistant", content: "", stats: { state: "streaming" } };
  state.messages.push({ role: "user", content: text }, answer);
  save();
  showAll();
  const box = $("messages").lastElementChild;
  const controller = new AbortController();
  setRunning(controller);
  const started = performance.now();
  let first = null;
  let usage = null;
  let frame = 0;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await failure(response));
    for await (const event of events(response)) {
      if (event.error) throw new Error(event.error.message);
      const delta = event.choices?.[0]?.delta?.content;
      if (delta) {
        first ??= performance.now();
        answer.content += delta;
        frame ||= requestAnimationFrame(() => {
          frame = 0;
          showMessage(box, answer);
          scrollDown(false);
        });
      }
      if (event.usage) usage = event.usage;
    }
    const tokens = usage?.completion_tokens ?? 0;
    const seconds = (performance.now() - (first ?? started)) / 1000;
    // Decode speed: the tokens after the first, over the time after it.
    answer.stats = { state: "done", tokens, speed: tokens > 1 && seconds > 0 ? (tokens - 1) / seconds : 0 };
  } catch (e) {
    answer.stats = controller.signal.aborted
      ? { state: "stopped" }
      : { state: "error", error: e.message };
  } finally {
    cancelAnimationFrame(frame);
    setRunning(null);
    showMessage(box, answer);
    save();
    scrollDown(false);
  }
}

function setRunning(controller) {
  running = controller;
  $("send").hidden = controller !== null;
  $("stop").hidden = controller === null;
  document.body.dataset.running = controller !== null;
}

// -- wiring -------------------------------------------------------------------------------------

function init() {
  for (const id of SETTINGS) {
    const input = $(id);
    if (state.settings[id] !== undefined) input.value = state.settings[id];
    input.addEventListener("input", () => {
      state.settings[id] = input.value;
      save();
      if (id === "api_key") loadModel();
    });
  }
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value;
    if (!text.trim() || running !== null) return;
    send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => running?.abort());
  $("new-chat").addEventListener("click", () => {
    running?.abort();
    state.messages = [];
    save();
    showAll();
  });
  showAll();
  loadModel();
  $("input").focus();
}

init();
