"""The page at / and /engine in a real browser: Playwright driving headless Chromium
(tests/browser.py) against real servers on a random Qwen3 with
Qwen3's chat template, whose scripted backend (tests/scripted_backend.py) writes known replies
through the real forward pass, paged KV cache and streaming path."""
from __future__ import annotations

import re
import threading
import time

import pytest
import tokenizers
from playwright.sync_api import expect
from scripted_backend import scripted_server_env, write_scripts
from server_fixtures import openai_client, own_server

from qwen_serve.conformance.models import IM_END

KEY = "page-test-key-7f3a"
XSS = ['Look: <img src=x onerror="window.pwned=1"> and <script>window.pwned=2</script> then **bold** and `code`. ',
       "[a link](javascript:window.pwned=3)"]
THINK_AND_CALL = ["<think>", "\nThe weather tool knows.\n", "</think>", "\n\n", "Let me look.", "\n", "<tool_call>",
                  '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "</tool_call>"]
ENDLESS = ["Counting:", " one"]  # no end: the last token repeats until max_tokens
TOOLS = '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", ' \
        '"properties": {"city": {"type": "string"}}}}}]'
SYSTEM = "You answer questions about the weather in European cities. " * 12


def spell(tokenizer: tokenizers.Tokenizer, pieces: list[str], end: bool = True) -> list[int]:
    ids = [t for piece in pieces for t in tokenizer.encode(piece, add_special_tokens=False).ids]
    return ids + [IM_END] if end else ids


@pytest.fixture(scope="module")
def scripts(qwen3_tiny, tmp_path_factory) -> dict:
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))
    return write_scripts({"xss": spell(tokenizer, XSS), "think and call": spell(tokenizer, THINK_AND_CALL),
                          "endless": spell(tokenizer, ENDLESS, end=False), "short": spell(tokenizer, ["Fine."])},
                         tmp_path_factory.mktemp("page-scripts"))


@pytest.fixture(scope="module")
def server(qwen3_tiny, scripts):
    args = ["--model", str(qwen3_tiny), "--backend", "scripted", "--kv-blocks", "256"]
    yield from own_server(args, env=scripted_server_env(scripts["_path"]))


@pytest.fixture(scope="module")
def keyed_server(qwen3_tiny, scripts):
    args = ["--model", str(qwen3_tiny), "--backend", "scripted", "--kv-blocks", "64", "--api-key", KEY]
    yield from own_server(args, env=scripted_server_env(scripts["_path"]))


@pytest.fixture
def page(browser):
    """A fresh browser context (its own local storage); page errors fail the test."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, errors


def set_settings(page, **values) -> None:
    page.click("#settings summary")
    for name, value in values.items():
        page.fill(f"#{name}", str(value))


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def test_a_reply_streams_in_with_thinking_folded_and_tool_calls_as_blocks(server, scripts, page):
    page.goto(server.base_url.removesuffix("/v1") + "/")
    set_settings(page, seed=scripts["think and call"], tools=TOOLS)
    send(page, "Weather in Paris?")
    reply = page.locator(".message.assistant").last
    expect(reply.locator(".tool-call")).to_contain_text("get_weather")
    expect(reply.locator(".tool-call pre")).to_have_text('{"city": "Paris"}')
    expect(reply.locator(".answer")).to_have_text("Let me look.")
    thinking = reply.locator("details.thinking")
    expect(thinking).to_be_visible()
    assert thinking.get_attribute("open") is None  # folded
    expect(thinking.locator(".thinking-text")).to_have_text("The weather tool knows.", use_inner_text=False)
    expect(page.locator("#send")).to_be_visible()  # the stream ended

    page.reload()  # kept in local storage
    expect(page.locator("#conversation-list li")).to_have_count(1)
    expect(page.locator(".message.assistant .tool-call")).to_contain_text("get_weather")
    expect(page.locator(".message.user")).to_contain_text("Weather in Paris?")


def test_html_in_a_reply_is_shown_as_text_and_runs_nothing(server, scripts, page):
    page.goto(server.base_url.removesuffix("/v1") + "/")
    set_settings(page, seed=scripts["xss"])
    send(page, "Show me some HTML.")
    answer = page.locator(".message.assistant .answer").last
    expect(answer).to_contain_text("then bold and code.")
    expect(answer).to_contain_text('<img src=x onerror="window.pwned=1">')
    expect(answer).to_contain_text("<script>window.pwned=2</script>")
    assert answer.locator("img, script").count() == 0
    expect(answer.locator("strong")).to_have_text("bold")  # markdown still renders
    expect(answer.locator("code")).to_have_text("code")
    link = answer.locator("a", has_text="a link")
    expect(link).to_be_visible()
    assert "javascript" not in (link.get_attribute("href") or "")  # the sanitiser's work: marked keeps it
    link.click()
    time.sleep(0.5)  # an onerror or the link would have run by now
    assert page.evaluate("window.pwned") is None


def test_the_page_forbids_inline_script_and_other_origins(server):
    status, headers, body = server.request("GET", "/", headers={"Accept": "text/html"})
    assert status == 200 and b'<script type="module" src="/page/app.js">' in body
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert b"<script>" not in body and not re.search(rb"\son[a-z]+\s*=", body)  # no inline script or handler
    status, _, body = server.request("GET", "/")  # API clients still get the JSON index
    assert status == 200 and b'"openapi"' in body
    status, _, _ = server.request("GET", "/page/../pyproject.toml")
    assert status == 404


def test_stop_aborts_the_request_and_its_blocks_return(server, scripts, page):
    server.wait_until_idle()
    baseline = server.metrics()
    assert baseline["kv_blocks_used"] == baseline["kv_blocks_cached"]
    page.goto(server.base_url.removesuffix("/v1") + "/")
    set_settings(page, seed=scripts["endless"], **{"max-tokens": 4000})
    send(page, "Count for a long time.")
    answer = page.locator(".message.assistant .answer").last
    expect(answer).to_contain_text("one one one")
    during = server.metrics()
    # it holds blocks beyond the idle baseline (used > cached alone would miss a moment when its
    # last block is full, and so published)
    assert during["requests_active"] == 1 and during["kv_blocks_used"] > baseline["kv_blocks_used"], during
    page.click("#stop")
    expect(page.locator(".message.assistant .note").last).to_have_text("(stopped)")
    after = server.wait_until_idle()
    assert after["kv_blocks_used"] == after["kv_blocks_cached"], after
    generated = after["decode_tokens_total"] - baseline["decode_tokens_total"]
    assert 0 < generated < 3900, generated  # cut mid-way, not run to max_tokens


def test_usable_at_phone_width_and_by_keyboard(server, scripts, browser):
    context = browser.new_context(viewport={"width": 390, "height": 800}, is_mobile=True)
    page = context.new_page()
    page.goto(server.base_url.removesuffix("/v1") + "/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    for selector in ("#prompt", "#send", "#new-chat", "#tab-engine"):
        expect(page.locator(selector)).to_be_in_viewport()
    set_settings(page, seed=scripts["short"])
    page.locator("#prompt").focus()
    page.keyboard.type("Hello")
    page.keyboard.press("Enter")  # sends from the keyboard
    expect(page.locator(".message.user")).to_have_text(re.compile("Hello"))
    expect(page.locator(".message.assistant .answer")).to_have_text("Fine.")
    context.close()


def served_model(client) -> str:
    return client.models.list().data[0].id


def grid_state(page) -> tuple[str | None, int, str]:
    return (page.locator("#block-grid").get_attribute("data-states"), page.locator("#requests tbody tr").count(),
            page.locator("#fig-running").inner_text())


def test_the_engine_view_follows_eight_requests(server, scripts, page):
    server.wait_until_idle()
    page.goto(server.base_url.removesuffix("/v1") + "/engine")
    expect(page.locator("#engine-note")).to_have_text("Live")
    expect(page.locator("#block-legend li[data-state='u'] .count")).to_have_text("0")
    seen: list[tuple] = []
    finished: list[str] = []
    with openai_client(server) as client:
        model = served_model(client)

        def one(i: int) -> None:
            reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"request {i}"}],
                                                   max_tokens=300, seed=scripts["endless"])
            finished.append(reply.choices[0].finish_reason)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            seen.append(grid_state(page))
            time.sleep(0.05)
        for thread in threads:
            thread.join()
    assert finished == ["length"] * 8
    grids = {grid for grid, _, _ in seen}
    assert len(grids) >= 3, seen  # the grid changed while they ran
    assert max(rows for _, rows, _ in seen) == 8, seen
    assert "8 / 16" in {running for _, _, running in seen}, seen
    expect(page.locator("#block-legend li[data-state='u'] .count")).to_have_text("0")  # all returned
    expect(page.locator("#requests tbody tr")).to_have_count(0)
    page.locator("#block-grid").focus()  # the grid from the keyboard
    page.keyboard.press("Home")
    expect(page.locator("#block-tip")).to_have_text(re.compile(r"^block 0: (free|cached only)"))
    page.keyboard.press("ArrowRight")
    expect(page.locator("#block-tip")).to_have_text(re.compile(r"^block 1: "))


def test_the_prefix_hit_counter_rises_on_a_repeated_system_prompt(server, scripts, page):
    page.goto(server.base_url.removesuffix("/v1") + "/engine")
    hits = page.locator("#fig-hits")
    expect(hits).to_have_text(re.compile(r"^\d+$"))
    before = int(hits.inner_text())
    with openai_client(server) as client:
        for question in ("Paris?", "Oslo?"):
            client.chat.completions.create(model=served_model(client), max_tokens=4, seed=scripts["short"], messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    expect(hits).not_to_have_text(str(before))
    assert int(hits.inner_text()) - before >= 4  # the shared system prompt's blocks
    expect(page.locator("#block-legend li[data-state='c'] .count")).not_to_have_text("0")


def test_with_a_key_the_page_gets_no_data_until_it_is_given(keyed_server, scripts, page):
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    base = keyed_server.base_url.removesuffix("/v1")
    page.goto(base + "/engine")  # the page's own files are open
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#engine-note")).to_contain_text("needs the server's API key")
    assert page.locator("#block-grid").get_attribute("data-states") is None
    assert page.locator("#model-name").inner_text() == ""

    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    expect(dialog).to_be_hidden()
    expect(page.locator("#engine-note")).to_have_text("Live")
    expect(page.locator("#block-legend li[data-state='.'] .count")).to_have_text("64")
    expect(page.locator("#model-name")).not_to_be_empty()
    page.click("#tab-chat")
    set_settings(page, seed=scripts["short"])
    send(page, "Hello?")
    expect(page.locator(".message.assistant .answer")).to_have_text("Fine.")
    assert urls and not [url for url in urls if KEY in url]


def test_the_stream_and_the_api_refuse_a_missing_key(keyed_server):
    for path in ("/engine/stream", "/v1/models", "/metrics"):
        status, _, _ = keyed_server.request("GET", path)
        assert status == 401, path
    for path in ("/", "/engine", "/page/app.js", "/page/vendor/purify.es.mjs"):
        status, _, _ = keyed_server.request("GET", path)
        assert status == 200, path
