"""The chat page ``tallow serve`` serves at ``/``, in a real headless Chromium (Debian's
``chromium``, driven by Playwright): it loads with the model's name, streams an answer (the same
text the API gives for the same request), stops one midway (and the server aborts it), keeps the
conversation over a reload, and never lets model output become markup.

``TALLOW_SCREENSHOTS=DIR`` saves the page's screenshots there (the README's come from
``TALLOW_SCREENSHOTS=docs python -m pytest tests/test_chat_page.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="the chat page tests need Playwright (in the test extra: pip install tallow[test])",
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip(
        "the chat page tests need Chromium (Debian's chromium package; scripts/test.sh "
        "installs it)",
        allow_module_level=True,
    )

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    """The page in a fresh browser context (its own, empty, local storage)."""
    context = browser.new_context(viewport={"width": 900, "height": 700})
    page = context.new_page()
    page.goto(f"{server}/")
    sync_api.expect(page.locator("#model")).to_have_text(MODEL)
    yield page
    context.close()


def screenshot(page: Any, name: str) -> None:
    folder = os.environ.get("TALLOW_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def settings(page: Any, **values: str) -> None:
    if page.locator("#settings").get_attribute("open") is None:
        page.locator("#settings summary").click()
    for name, value in values.items():
        page.locator(f"#{name}").fill(value)


def send(page: Any, text: str) -> None:
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")


def stored(page: Any) -> dict[str, Any]:
    return json.loads(page.evaluate("() => localStorage.getItem('tallow-chat')"))


def last_answer(page: Any) -> Any:
    return page.locator("article.assistant").last


def test_an_answer_streams_in_and_matches_the_api(page: Any, client: openai.OpenAI) -> None:
    settings(page, system="You are a concise programmer.", temperature="0", max_tokens="96")
    # Record the answer's length at every change of the page while it streams.
    page.evaluate(
        """() => {
            window.lengths = [];
            new MutationObserver(() => {
                const answers = document.querySelectorAll('article.assistant .content');
                const last = answers[answers.length - 1];
                if (last) window.lengths.push(last.textContent.length);
            }).observe(document.getElementById('messages'),
                       {subtree: true, childList: true, characterData: true});
        }"""
    )
    with page.expect_request("**/v1/chat/completions") as sent:
        send(page, "Write a Python function that reverses a string.")
    body = sent.value.post_data_json
    assert body["messages"] == [
        {"role": "system", "content": "You are a concise programmer."},
        {"role": "user", "content": "Write a Python function that reverses a string."},
    ]
    assert (body["temperature"], body["max_tokens"], body["stream"]) == (0, 96, True)
    sync_api.expect(last_answer(page)).to_have_attribute("data-state", "done", timeout=30_000)

    answer = stored(page)["messages"][1]["content"]
    lengths = page.evaluate("() => window.lengths")
    final = last_answer(page).locator(".content").evaluate("e => e.textContent.length")
    partial = {n for n in lengths if 0 < n < final}
    assert len(partial) >= 2, f"the answer did not stream: lengths seen {lengths}"
    # The same request through the API gives the same text, and the token count shown.
    same = client.chat.completions.create(
        model=MODEL,
        messages=body["messages"],
        temperature=0,
        top_p=body["top_p"],
        max_tokens=96,
    )
    assert answer == same.choices[0].message.content
    assert same.usage is not None
    stats = last_answer(page).locator(".stats").inner_text()
    assert re.fullmatch(rf"{same.usage.completion_tokens} tokens · \d+\.\d tok/s", stats), stats
    page.locator("#settings summary").click()  # closed, for the screenshot
    screenshot(page, "chat-page")


def test_stop_ends_an_answer_midway_and_the_server_aborts_it(page: Any, server: str) -> None:
    settings(page, temperature="0.8", max_tokens="400")
    send(page, "Tell me a very long story about a dragon and a lighthouse.")
    answer = last_answer(page)
    content = answer.locator(".content")
    deadline = time.monotonic() + 30
    while len(content.inner_text()) < 40:
        state = answer.get_attribute("data-state")
        assert state == "streaming", f"{state}: {answer.locator('.stats').inner_text()}"
        assert time.monotonic() < deadline, "no text streamed in"
        time.sleep(0.02)
    page.locator("#stop").click()
    sync_api.expect(last_answer(page)).to_have_attribute("data-state", "stopped")
    sync_api.expect(page.locator("#send")).to_be_visible()
    screenshot(page, "chat-page-stopped")
    text = content.inner_text()
    time.sleep(0.5)
    assert content.inner_text() == text
    assert stored(page)["messages"][1]["stats"] == {"state": "stopped"}
    # The server aborted the request (400 tokens take seconds more to generate).
    deadline = time.monotonic() + 3
    while "tallow_requests_running 0.0" not in httpx.get(f"{server}/metrics").text:
        assert time.monotonic() < deadline, "the server is still generating the stopped answer"
        time.sleep(0.05)


def test_the_conversation_and_settings_survive_a_reload(page: Any) -> None:
    settings(page, temperature="0", max_tokens="12", system="Be brief.")
    send(page, "Hello!")
    sync_api.expect(last_answer(page)).to_have_attribute("data-state", "done", timeout=30_000)
    before = page.locator("article .content").all_inner_texts()
    page.reload()
    sync_api.expect(page.locator("#model")).to_have_text(MODEL)
    assert page.locator("article .content").all_inner_texts() == before
    assert before[0] == "Hello!" and before[1]
    assert page.locator("#temperature").input_value() == "0"
    assert page.locator("#system").input_value() == "Be brief."
    page.locator("#new-chat").click()
    assert page.locator("article").count() == 0
    page.reload()
    sync_api.expect(page.locator("#model")).to_have_text(MODEL)
    assert page.locator("article").count() == 0


HOSTILE = "\n".join(
    [
        "# Title with <b>tags</b>",
        '<img src=x onerror="window.pwned=1"> and <script>window.pwned=2</script>',
        "**bold** and *italics* and `<i>code</i>` and snake_case_name",
        "[safe](https://example.com/a) and [unsafe](javascript:window.pwned=3)",
        "- one",
        "- <u>two</u>",
        "",
        "```html",
        '<button onclick="window.pwned=4">x</button>',
        "```",
        "> quoted <em>text</em>",
    ]
)


def test_model_output_is_rendered_as_markdown_never_as_html(page: Any) -> None:
    """An answer full of markup, streamed to the page as the server would: it comes out as
    markdown, with every tag as text, no element the model named, and no unsafe link."""

    def fake_answer(route: Any) -> None:
        pieces = [HOSTILE[i : i + 7] for i in range(0, len(HOSTILE), 7)]
        events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
        events.append({"choices": [], "usage": {"completion_tokens": len(pieces)}})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        route.fulfill(status=200, content_type="text/event-stream", body=body)

    page.route("**/v1/chat/completions", fake_answer)
    send(page, "Show me some markup.")
    answer = last_answer(page)
    sync_api.expect(answer).to_have_attribute("data-state", "done")
    content = answer.locator(".content")
    for tag in ("img", "script", "b", "i", "u", "button"):
        assert content.locator(tag).count() == 0, tag
    assert page.evaluate("() => window.pwned") is None
    text = content.inner_text()
    assert '<img src=x onerror="window.pwned=1">' in text and "<script>" in text
    assert content.locator("h3").inner_text() == "Title with <b>tags</b>"
    assert content.locator("strong").inner_text() == "bold"
    assert content.locator("em").inner_text() == "italics"
    assert content.locator(":not(pre) > code").inner_text() == "<i>code</i>"
    assert "snake_case_name" in text  # underscores inside a word are not italics
    links = content.locator("a")
    assert links.count() == 1 and links.get_attribute("href") == "https://example.com/a"
    assert "noopener" in (links.get_attribute("rel") or "")
    assert "[unsafe](javascript:window.pwned=3)" in text
    assert content.locator("ul li").all_inner_texts() == ["one", "<u>two</u>"]
    code = content.locator("pre code")
    assert code.inner_text() == '<button onclick="window.pwned=4">x</button>'
    assert code.get_attribute("class") == "language-html"
    assert content.locator("blockquote").inner_text() == "quoted <em>text</em>"


def test_the_page_works_offline_from_the_server_alone(page: Any, server: str) -> None:
    """Every resource the page loads comes from the server itself (no CDN), and the page
    forbids scripts from anywhere else."""
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    page.reload()
    sync_api.expect(page.locator("#model")).to_have_text(MODEL)
    assert seen and all(url.startswith(server) for url in seen), seen
    policy = httpx.get(f"{server}/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
