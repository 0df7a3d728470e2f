"""Takes the screenshots of the page in docs/serving.md: the chat page after one exchange with the
embedded SmolLM2, and the engine view while eight requests with a shared system prompt decode.

    flock /work/cpu.lock python docs/images/screenshots.py

Needs the dev extras (Playwright) and Chromium (Debian's `chromium`, as tests/test_page.py).
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import openai
from playwright.sync_api import expect, sync_playwright

from qwen_serve.bench.launcher import LaunchedServer

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a concise assistant who answers in short markdown lists. " * 4


def main() -> int:
    server = LaunchedServer([sys.executable, "-m", "qwen_serve", "--port", "{port}", "--kv-blocks", "384",
                             "--max-batch", "8"], name="qwen-serve")
    with server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 720})
        page.goto(server.url + "/")
        page.click("#settings summary")
        page.fill("#system-prompt", SYSTEM)
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "120")
        page.fill("#prompt", "Give me three tips for writing readable Python, as a list.")
        page.press("#prompt", "Enter")
        expect(page.locator("#send")).to_be_visible(timeout=120_000)
        page.click("#settings summary")
        page.screenshot(path=HERE / "page-chat.png")

        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        model = client.models.list().data[0].id

        def ask(i: int) -> None:
            client.chat.completions.create(model=model, max_tokens=160, extra_body={"ignore_eos": True}, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}: name a city."}])

        page.click("#tab-engine")
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        time.sleep(4)
        page.screenshot(path=HERE / "page-engine.png", full_page=True)
        for thread in threads:
            thread.join()
        browser.close()
    print(f"wrote {HERE / 'page-chat.png'} and {HERE / 'page-engine.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
