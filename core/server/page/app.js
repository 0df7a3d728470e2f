// The page: two tabs on one URL space (/ chat, /engine the live view), the API-key dialog and the
// server's status line. The engine stream is open only while its tab is shown.

import { apiFetch, apiKey, setApiKey, Unauthorized } from "./api.js";
import { Chat } from "./chat.js";
import { EngineView } from "./engine.js";

const dialog = document.getElementById("key-dialog");
const keyInput = document.getElementById("key-input");

function askForKey() {
  if (dialog.open) return;
  keyInput.value = apiKey();
  dialog.showModal();
  keyInput.focus();
}

const chat = new Chat({ onUnauthorized: askForKey });
const engine = new EngineView({ onUnauthorized: askForKey });

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey(keyInput.value.trim(), document.getElementById("key-remember").checked);
  dialog.close();
  checkServer();
  if (location.pathname === "/engine") {
    engine.stop();
    engine.start();
  }
});
document.getElementById("key-cancel").addEventListener("click", () => dialog.close());
document.getElementById("key-button").addEventListener("click", askForKey);

function show(path) {
  const onEngine = path === "/engine";
  document.getElementById("chat-view").hidden = onEngine;
  document.getElementById("engine-view").hidden = !onEngine;
  for (const [id, active] of [["tab-chat", !onEngine], ["tab-engine", onEngine]]) {
    const tab = document.getElementById(id);
    if (active) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
  }
  if (onEngine) engine.start();
  else engine.stop();
}

for (const id of ["tab-chat", "tab-engine"]) {
  document.getElementById(id).addEventListener("click", (event) => {
    event.preventDefault();
    const path = new URL(event.currentTarget.href).pathname;
    if (path !== location.pathname) history.pushState(null, "", path);
    show(path);
  });
}
window.addEventListener("popstate", () => show(location.pathname));

async function checkServer() {
  const status = document.getElementById("server-status");
  try {
    const health = await (await fetch("/health")).json();
    status.textContent = health.status === "ok" ? "" : `server: ${health.status}`;
    const models = await (await apiFetch("/v1/models")).json();
    document.getElementById("model-name").textContent = models.data[0]?.id || "";
  } catch (error) {
    if (error instanceof Unauthorized) askForKey();
    else status.textContent = `server: ${error.message}`;
  }
}

show(location.pathname);
checkServer();
