"""Chat templates, ``LLM.chat`` / ``AsyncLLM.chat``, and ``tallow chat`` in a real terminal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pexpect
import pytest

import tallow
from tallow.chat_template import DEFAULT_TEMPLATE, ChatTemplate

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_the_models_own_template(smollm2: tallow.LLM) -> None:
    template = smollm2.chat_template
    assert template.source == smollm2.metadata()["tokenizer.chat_template"]
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    # SmolLM2's template adds its default system message when none is given.
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    conversation = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "2+2"}, {"type": "text", "text": "?"}],
        },
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert template.render(conversation, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    )


def test_the_default_template_is_chatml() -> None:
    template = ChatTemplate(DEFAULT_TEMPLATE)
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_hf_conventions_and_the_sandbox() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] == 'assistant' and loop.first %}"
        "{{ raise_exception('Conversations must start with the user') }}{% endif %}"
        "{{ m['content'] | tojson }}{% if loop.last %}{% break %}{% endif %}{% endfor %}",
        bos_token="<s>",
    )
    assert template.render([{"role": "user", "content": "héllo"}]) == '<s>"héllo"'
    with pytest.raises(tallow.InvalidArgumentError, match="must start with the user"):
        template.render([{"role": "assistant", "content": "x"}])
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(tallow.InvalidArgumentError):
        escape.render([{"role": "user", "content": "x"}])
    with pytest.raises(tallow.InvalidArgumentError, match="does not compile"):
        ChatTemplate("{% for %}")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "Hi",
        [{"role": "user"}, "x"],
        [{"role": "wizard", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
    ],
)
def test_malformed_messages_are_refused(smollm2: tallow.LLM, messages: object) -> None:
    with pytest.raises(tallow.InvalidArgumentError):
        smollm2.chat(messages, max_tokens=2)  # type: ignore[arg-type]


def test_chat_is_generation_from_the_rendered_template(smollm2: tallow.LLM) -> None:
    messages = [{"role": "user", "content": "Name a color."}]
    reply = smollm2.chat(messages, max_tokens=12, temperature=0)
    text = smollm2.chat_template.render(messages)
    plain = smollm2.generate(text, max_tokens=12, temperature=0)
    assert reply.token_ids == plain.token_ids
    assert reply.text == plain.text
    assert reply.prompt_tokens == len(smollm2.tokenize(text, False, True))
    streamed = "".join(smollm2.chat_stream(messages, max_tokens=12, temperature=0))
    assert streamed == reply.text


def test_async_chat_matches_llm_chat(smollm2_path: Path, smollm2: tallow.LLM) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    expected = smollm2.chat(messages, max_tokens=16, temperature=0)

    async def main() -> tuple[tallow.GenerationResult, str]:
        async with tallow.AsyncLLM(smollm2_path, n_ctx=512) as llm:
            done = await llm.chat(messages, max_tokens=16, temperature=0)
            pieces = [p async for p in llm.chat_stream(messages, max_tokens=16, temperature=0)]
            return done, "".join(pieces)

    done, streamed = anyio.run(main)
    assert done.token_ids == expected.token_ids
    assert done.text == streamed == expected.text
    assert done.prompt_tokens == expected.prompt_tokens


def test_tallow_chat_in_a_terminal(smollm2_path: Path) -> None:
    """Streaming answers, /reset, Ctrl-C stopping an answer without leaving, and /exit."""
    question = "What is the capital of France?"
    # The terminal must show the greedy answer the Python API gives: its first line, up to
    # 20 characters (the small model's answer itself may change with the kernels' rounding).
    answer = tallow.LLM(smollm2_path).chat(
        [{"role": "user", "content": question}], max_tokens=12, temperature=0.0
    )
    expected = answer.text.strip().splitlines()[0][:20]
    assert expected
    child = pexpect.spawn(
        sys.executable,
        ["-m", "tallow", "chat", "-m", str(smollm2_path), "--temperature", "0", "--ctx", "1024"],
        env={**os.environ, "TERM": "dumb"},
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 200),
    )
    try:
        child.expect("/reset clears the conversation")
        child.expect("> ")
        child.sendline(question)
        child.expect_exact(expected)
        child.expect("\n> ")
        child.sendline("/reset")
        child.expect(r"\(conversation cleared\)")
        child.expect("> ")
        child.sendline("/nonsense")
        child.expect("unknown command /nonsense")
        child.expect("> ")
        # A long answer, stopped after its first words.
        child.sendline("Write a very long story about a dragon who learns to cook.")
        child.expect("cook.\r\n")  # the terminal's echo of the line
        child.expect(r"\w+ \w+ \w+")
        child.sendintr()
        child.expect(r"\[stopped\]")
        child.expect("> ")
        # The session goes on after the interruption.
        child.sendline("Say hello.")
        child.expect(r"\w+")
        child.expect("\n> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
