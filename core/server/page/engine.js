// The engine tab: one stream of engine views from /engine/stream while the tab is open (the
// engine takes none when nobody watches), drawn as figures, a history chart, the request table
// and the KV block pool. Behind the Ray ingress each replica sends its own views; one is shown
// at a time, chosen in the replica menu.

import { apiFetch, readEvents, Unauthorized } from "./api.js";

const STATES = [
  [".", "free"], ["u", "in use"], ["s", "shared (ref > 1)"], ["w", "copy-on-write copy"], ["c", "cached only"],
];
const COLOURS = { ".": "#e4e7eb", u: "#3b82f6", s: "#f59e0b", w: "#a855f7", c: "#10b981" };
const HISTORY_S = 300;

function byId(id) {
  return document.getElementById(id);
}

function set(id, text) {
  byId(id).textContent = text;
}

// "u12.300c4" -> "uuuuuuuuuuuu....": one letter a block.
export function expandRuns(runs) {
  let states = "";
  for (const [, letter, count] of runs.matchAll(/(\D)(\d+)/g)) states += letter.repeat(Number(count));
  return states;
}

export class EngineView {
  constructor({ onUnauthorized }) {
    this.onUnauthorized = onUnauthorized;
    this.controller = null;
    this.engines = new Map();  // engine ("" or a replica id) -> { view, history: second -> [tokens, running] }
    this.shown = null;  // the engine drawn
    this.view = null;
    this.history = new Map();
    this.states = "";
    this.picker = byId("replica-picker");
    this.picker.addEventListener("change", () => {
      this.shown = this.picker.value;
      this.draw();
    });
    this.grid = byId("block-grid");
    this.tip = byId("block-tip");
    this.legend = byId("block-legend");
    this.legend.replaceChildren(...STATES.map(([letter, name]) => {
      const item = document.createElement("li");
      item.dataset.state = letter;
      const swatch = document.createElement("span");
      swatch.className = `swatch state-${letter === "." ? "free" : letter}`;
      const count = document.createElement("b");
      count.className = "count";
      count.textContent = "0";
      item.append(swatch, ` ${name} `, count);
      return item;
    }));
    this.grid.addEventListener("mousemove", (event) => this.showTip(event));
    this.grid.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.grid.addEventListener("keydown", (event) => this.moveCursor(event));
    this.grid.addEventListener("blur", () => { this.tip.hidden = true; });
    window.addEventListener("resize", () => this.draw());
  }

  start() {
    if (this.controller) return;
    this.controller = new AbortController();
    this.follow(this.controller.signal);
  }

  stop() {
    this.controller?.abort();
    this.controller = null;
  }

  async follow(signal) {
    const note = byId("engine-note");
    while (!signal.aborted) {
      try {
        note.textContent = "Connecting…";
        const response = await apiFetch("/engine/stream", { signal });
        note.textContent = this.view ? "Live" : "Live; no engine view yet (a replica shows once it has served)";
        for await (const data of readEvents(response)) {
          this.receive(JSON.parse(data));
          note.textContent = "Live";
        }
        note.textContent = "The stream ended; reconnecting…";
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof Unauthorized) {
          note.textContent = "The engine view needs the server's API key.";
          this.onUnauthorized();
          return;
        }
        note.textContent = `Not connected: ${error.message}; retrying…`;
      }
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  receive(view) {
    const name = view.replica || "";
    if (!this.engines.has(name)) {
      this.engines.set(name, { view, history: new Map() });
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name;
      this.picker.append(option);
      this.picker.parentElement.hidden = !name;
      if (this.shown === null) this.shown = name;
    }
    const engine = this.engines.get(name);
    for (const [second, tokens, running] of view.history) engine.history.set(second, [tokens, running]);
    for (const second of engine.history.keys()) if (second <= view.now - HISTORY_S) engine.history.delete(second);
    engine.view = view;
    if (name === this.shown) this.draw();
  }

  draw() {
    const engine = this.engines.get(this.shown);
    if (!engine) return;
    const view = (this.view = engine.view);
    this.history = engine.history;
    this.states = view.blocks ? expandRuns(view.blocks.runs) : "";
    const snap = view.snapshot;
    const running = view.requests.filter((r) => r.phase === "prefill" || r.phase === "decode").length;
    set("fig-running", `${running} / ${view.max_batch}`);
    set("fig-waiting", String(snap.queue_depth));
    set("fig-tps", snap.tokens_per_sec.toFixed(1));
    set("fig-kv", `${snap.kv_blocks_used} / ${snap.kv_blocks_total}`);
    set("fig-hits", String(snap.prefix_cache_hits));
    const hitTokens = snap.prefix_cache_hits * view.block_size;
    const seen = hitTokens + snap.prefill_tokens_total;
    set("fig-hit-rate", seen ? `${((100 * hitTokens) / seen).toFixed(1)} %` : "–");
    set("fig-preemptions", String(snap.preemptions_total));
    const rejected = Object.values(view.server.rejected).reduce((a, b) => a + b, 0);
    set("fig-rejected", String(rejected));
    set("fig-cow", String(view.cow_copies));
    byId("card-states").hidden = !view.states_total;
    set("fig-states", `${view.states_used} / ${view.states_total} (${view.state_snapshots} cached)`);
    set("model-name", view.server.model);
    this.drawRequests(view);
    this.drawHistory(view.now);
    this.drawBlocks(view);
  }

  drawRequests(view) {
    const body = byId("requests").tBodies[0];
    body.replaceChildren(...view.requests.map((r) => {
      const row = document.createElement("tr");
      row.dataset.phase = r.phase;
      const phase = r.phase === "prefill" ? `prefill ${r.chunk}/${r.chunks}` : r.phase;
      const id = r.request_id.length > 18 ? `${r.request_id.slice(0, 18)}…` : r.request_id;
      const cells = [r.choice ? `${id} #${r.choice}` : id, phase, `${r.prompt_tokens} (${r.cached_tokens})`,
        `${r.output_tokens} / ${r.max_tokens}`, String(r.blocks.length), String(r.preemptions), `${r.age_s.toFixed(1)} s`];
      for (const text of cells) {
        const cell = document.createElement("td");
        cell.textContent = text;
        row.append(cell);
      }
      row.title = r.request_id;
      return row;
    }));
  }

  drawHistory(now) {
    const canvas = byId("history-chart");
    const width = canvas.clientWidth || canvas.width;
    canvas.width = width;
    const height = canvas.height;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, width, height);
    const points = [...this.history.entries()].map(([second, [tokens, running]]) => [now - second, tokens, running]);
    const maxTokens = Math.max(1, ...points.map((p) => p[1]));
    const maxRunning = Math.max(1, this.view.max_batch);
    const x = (ago) => width - 1 - (ago / HISTORY_S) * (width - 1);
    ctx.strokeStyle = "#d0d4da";
    ctx.beginPath();
    ctx.moveTo(0, height - 0.5);
    ctx.lineTo(width, height - 0.5);
    ctx.stroke();
    ctx.fillStyle = "#3b82f6";
    const bar = Math.max(1, width / HISTORY_S);
    for (const [ago, tokens] of points) {
      const h = (tokens / maxTokens) * (height - 16);
      ctx.fillRect(x(ago) - bar, height - h, bar, h);
    }
    ctx.strokeStyle = "#f59e0b";
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.sort((a, b) => b[0] - a[0]).forEach(([ago, , running], i) => {
      const y = height - (running / maxRunning) * (height - 16);
      if (i) ctx.lineTo(x(ago), y);
      else ctx.moveTo(x(ago), y);
    });
    ctx.stroke();
    ctx.lineWidth = 1;
    ctx.fillStyle = "#555";
    ctx.font = "12px sans-serif";
    ctx.fillText(`${maxTokens} tok/s`, 4, 12);
    ctx.fillText("5 min ago", 4, height - 4);
  }

  cellSize(count, width) {
    for (const size of [14, 10, 7, 5, 3, 2]) if (Math.ceil(count / Math.floor(width / size)) * size <= 480) return size;
    return 2;
  }

  drawBlocks(view) {
    const caption = byId("block-caption");
    if (!view.blocks) {
      caption.textContent = `(${view.cache} cannot describe its blocks)`;
      this.grid.hidden = true;
      return;
    }
    this.grid.hidden = false;
    const states = this.states;
    caption.textContent = `${states.length} blocks of ${view.block_size} tokens · ${view.cache}`;
    this.grid.dataset.states = view.blocks.runs;
    const counts = {};
    for (const letter of states) counts[letter] = (counts[letter] || 0) + 1;
    for (const item of this.legend.children) item.querySelector(".count").textContent = String(counts[item.dataset.state] || 0);
    const width = this.grid.parentElement.clientWidth || 600;
    const size = this.cellSize(states.length, width);
    const columns = Math.max(1, Math.floor(width / size));
    this.gridLayout = { size, columns };
    this.grid.width = columns * size;
    this.grid.height = Math.ceil(states.length / columns) * size;
    const ctx = this.grid.getContext("2d");
    const gap = size > 4 ? 1 : 0;
    for (let i = 0; i < states.length; i++) {
      ctx.fillStyle = COLOURS[states[i]] || "#000";
      ctx.fillRect((i % columns) * size, Math.floor(i / columns) * size, size - gap, size - gap);
    }
  }

  // The block under the pointer.
  showTip(event) {
    if (!this.gridLayout || !this.view) return;
    const { size, columns } = this.gridLayout;
    const rect = this.grid.getBoundingClientRect();
    const column = Math.floor((event.clientX - rect.left) / size);
    const block = Math.floor((event.clientY - rect.top) / size) * columns + column;
    if (column >= columns) this.tip.hidden = true;
    else this.describeBlock(block);
  }

  // Arrow keys, Home and End walk the grid from the keyboard.
  moveCursor(event) {
    if (!this.gridLayout || !this.states.length) return;
    const steps = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: this.gridLayout.columns, ArrowUp: -this.gridLayout.columns };
    const last = this.states.length - 1;
    const at = this.cursor ?? -1;
    let next;
    if (event.key in steps) next = Math.min(last, Math.max(0, at + steps[event.key]));
    else if (event.key === "Home") next = 0;
    else if (event.key === "End") next = last;
    else return;
    event.preventDefault();
    this.cursor = next;
    this.describeBlock(next);
  }

  describeBlock(block) {
    if (block < 0 || block >= this.states.length) {
      this.tip.hidden = true;
      return;
    }
    const { size, columns } = this.gridLayout;
    const name = Object.fromEntries(STATES)[this.states[block]];
    const refs = this.view.blocks.shared_refs[String(block)];
    const holders = this.view.requests.filter((r) => r.blocks.includes(block)).map((r) => r.request_id);
    this.tip.textContent = `block ${block}: ${name}${refs ? ` by ${refs}` : ""}` +
      (holders.length ? ` · ${holders.join(", ")}` : "");
    this.tip.hidden = false;
    this.tip.style.left = `${(block % columns) * size + size + 4}px`;
    this.tip.style.top = `${Math.floor(block / columns) * size + size + 4}px`;
  }
}
