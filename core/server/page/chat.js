// The chat tab: conversations in local storage, streamed replies from /v1/chat/completions,
// thinking folded apart from the answer, tool calls as blocks, markdown through marked and then
// DOMPurify (raw HTML in a reply is shown as text, and the sanitiser runs on everything).

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";
import { apiFetch, readEvents, Unauthorized } from "./api.js";

const STORE = "qwen-serve.conversations";
const SETTINGS = "qwen-serve.settings";

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// A model's raw HTML is text to show, not markup to run.
const markdown = new Marked({ gfm: true, renderer: { html: ({ text }) => escapeHtml(text) } });

export function renderMarkdown(element, text) {
  element.innerHTML = DOMPurify.sanitize(markdown.parse(text, { async: false }));
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function loadJson(name, fallback) {
  try {
    return JSON.parse(localStorage.getItem(name)) ?? fallback;
  } catch {
    return fallback;
  }
}

// One assistant message on screen: thinking (folded), answer, tool calls.
class ReplyView {
  constructor(container) {
    this.root = element("article", "message assistant");
    this.root.append(element("div", "role", "Assistant"));
    this.thinking = element("details", "thinking");
    this.thinking.append(element("summary", null, "Thinking"));
    this.thinkingText = element("div", "thinking-text");
    this.thinking.append(this.thinkingText);
    this.thinking.hidden = true;
    this.answer = element("div", "answer");
    this.tools = element("div", "tool-calls");
    this.note = element("div", "note");
    this.root.append(this.thinking, this.answer, this.tools, this.note);
    container.append(this.root);
    this.pending = false;
  }

  show(message) {
    if (message.reasoning) {
      this.thinking.hidden = false;
      renderMarkdown(this.thinkingText, message.reasoning);
    }
    renderMarkdown(this.answer, message.content || "");
    this.tools.replaceChildren(...(message.tool_calls || []).map((call) => {
      const block = element("div", "tool-call");
      block.append(element("div", "tool-name", `tool call: ${call.function?.name || ""}`),
        element("pre", null, call.function?.arguments || ""));
      return block;
    }));
    this.note.textContent = message.note || "";
  }

  // Re-render at most once a frame while deltas stream in.
  update(message) {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.show(message);
    });
  }
}

export class Chat {
  constructor({ onUnauthorized }) {
    this.onUnauthorized = onUnauthorized;
    this.conversations = loadJson(STORE, []);
    this.current = null;
    this.controller = null;
    this.messages = document.getElementById("messages");
    this.list = document.getElementById("conversation-list");
    this.prompt = document.getElementById("prompt");
    this.send = document.getElementById("send");
    this.stop = document.getElementById("stop");
    this.settings = {
      system: document.getElementById("system-prompt"),
      temperature: document.getElementById("temperature"),
      maxTokens: document.getElementById("max-tokens"),
      seed: document.getElementById("seed"),
      thinking: document.getElementById("thinking"),
      tools: document.getElementById("tools"),
    };
    const saved = loadJson(SETTINGS, {});
    for (const [name, input] of Object.entries(this.settings)) {
      if (saved[name] === undefined) continue;
      if (input.type === "checkbox") input.checked = saved[name];
      else input.value = saved[name];
    }
    for (const input of Object.values(this.settings)) input.addEventListener("change", () => this.saveSettings());

    document.getElementById("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.submit();
      }
    });
    this.stop.addEventListener("click", () => this.controller?.abort());
    document.getElementById("new-chat").addEventListener("click", () => this.open(null));
    this.open(this.conversations[0]?.id ?? null);
  }

  saveSettings() {
    const values = Object.fromEntries(Object.entries(this.settings).map(
      ([name, input]) => [name, input.type === "checkbox" ? input.checked : input.value]));
    localStorage.setItem(SETTINGS, JSON.stringify(values));
  }

  save() {
    localStorage.setItem(STORE, JSON.stringify(this.conversations));
    this.drawList();
  }

  drawList() {
    this.list.replaceChildren(...this.conversations.map((conversation) => {
      const item = element("li");
      const open = element("button", conversation.id === this.current?.id ? "current" : "", conversation.title);
      open.type = "button";
      open.addEventListener("click", () => this.open(conversation.id));
      const remove = element("button", "remove", "×");
      remove.type = "button";
      remove.setAttribute("aria-label", `Delete "${conversation.title}"`);
      remove.addEventListener("click", () => this.remove(conversation.id));
      item.append(open, remove);
      return item;
    }));
  }

  open(id) {
    if (this.controller) return;  // not while a reply streams
    this.current = this.conversations.find((c) => c.id === id) || null;
    this.messages.replaceChildren();
    for (const message of this.current?.messages || []) this.draw(message);
    this.drawList();
    this.prompt.focus();
  }

  remove(id) {
    if (this.controller && this.current?.id === id) return;
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.current?.id === id) this.open(null);
    this.save();
  }

  draw(message) {
    if (message.role === "user") {
      const node = element("article", "message user");
      node.append(element("div", "role", "You"), element("div", "text", message.content));
      this.messages.append(node);
      return null;
    }
    const view = new ReplyView(this.messages);
    view.show(message);
    return view;
  }

  request(messages) {
    const s = this.settings;
    const body = { messages, stream: true, stream_options: { include_usage: true },
      chat_template_kwargs: { enable_thinking: s.thinking.checked } };
    const system = s.system.value.trim();
    if (system) body.messages = [{ role: "system", content: system }, ...messages];
    const temperature = parseFloat(s.temperature.value);
    if (!Number.isNaN(temperature)) body.temperature = temperature;
    const maxTokens = parseInt(s.maxTokens.value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    const seed = parseInt(s.seed.value, 10);
    if (!Number.isNaN(seed)) body.seed = seed;
    const tools = s.tools.value.trim();
    if (tools) {
      try {
        body.tools = JSON.parse(tools);
      } catch (error) {
        throw new Error(`the tools setting is not JSON: ${error.message}`);
      }
    }
    return body;
  }

  async submit() {
    const text = this.prompt.value.trim();
    if (!text || this.controller) return;
    if (!this.current) {
      this.current = { id: crypto.randomUUID(), title: text.slice(0, 40), messages: [] };
      this.conversations.unshift(this.current);
    }
    const conversation = this.current;
    const user = { role: "user", content: text };
    conversation.messages.push(user);
    this.draw(user);
    this.prompt.value = "";
    this.save();

    const history = conversation.messages.map(({ role, content, tool_calls }) =>
      (tool_calls?.length ? { role, content, tool_calls } : { role, content }));
    const reply = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
    const view = new ReplyView(this.messages);
    this.controller = new AbortController();
    this.send.hidden = true;
    this.stop.hidden = false;
    try {
      const body = JSON.stringify(this.request(history));
      const response = await apiFetch("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" }, body, signal: this.controller.signal });
      for await (const data of readEvents(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          reply.content += delta.content || "";
          reply.reasoning += delta.reasoning_content || "";
          for (const call of delta.tool_calls || []) {
            const slot = reply.tool_calls[call.index] ??= { id: call.id, type: "function", function: { name: "", arguments: "" } };
            slot.function.name += call.function?.name || "";
            slot.function.arguments += call.function?.arguments || "";
          }
          if (choice.finish_reason === "length") reply.note = "(cut at the token limit)";
        }
        view.update(reply);
      }
    } catch (error) {
      if (error.name === "AbortError") reply.note = "(stopped)";
      else if (error instanceof Unauthorized) {
        reply.note = "The server needs an API key.";
        this.onUnauthorized();
      } else reply.note = `Error: ${error.message}`;
    } finally {
      this.controller = null;
      this.send.hidden = false;
      this.stop.hidden = true;
    }
    if (!reply.tool_calls.length) delete reply.tool_calls;
    if (!reply.reasoning) delete reply.reasoning;
    view.show(reply);
    conversation.messages.push(reply);
    this.save();
    this.prompt.focus();
  }
}
