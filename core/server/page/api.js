// Talking to the server: the API key (kept in session or local storage, sent only as a header),
// fetch with it, and server-sent events read from a fetch body (EventSource cannot send a header).

const KEY_NAME = "qwen-serve.api-key";

export function apiKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

export function setApiKey(key, remember) {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  if (key) (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

export class Unauthorized extends Error {}

// fetch with the key; a 401 raises Unauthorized, any other error status an Error with the
// server's message.
export async function apiFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) throw new Unauthorized("the server needs an API key");
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      message = body?.error?.message || message;
    } catch { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

// Yields each event's data (comments and other fields skipped) as the body arrives.
export async function* readEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = block.split(/\r?\n/).filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
        if (data) yield data;
      }
    }
  } finally {
    reader.releaseLock();
  }
}
