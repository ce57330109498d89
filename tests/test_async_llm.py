"""AsyncLLM: concurrent requests through continuous batching give exactly what each request
gives alone (with f16 and q8_0 KV pages); preemption, seeds and cancellation keep that true and
leak no pages."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import tallow
from tallow.async_llm import AsyncLLM
from tallow.engine import Engine
from tallow.output import GenerationResult
from tallow.scheduler import Step

PROMPTS = [
    "Hello, my name is",
    "The largest planet in the solar system is",
    "for i in range(10):",
    "Paris is a city in",
    "Once upon a time, in a small village,",
    "The recipe needs two eggs and",
    "def fibonacci(n):",
    "In 1969, astronauts",
]


def prompts(n: int) -> list[tuple[str, int]]:
    """n (prompt, max_tokens) pairs of different prompts and lengths."""
    return [(f"{PROMPTS[i % len(PROMPTS)]} ({i})", 4 + (i * 5) % 13) for i in range(n)]


async def run_all(
    llm: AsyncLLM, cases: list[tuple[str, int]], **kw: object
) -> list[GenerationResult]:
    results: list[GenerationResult | None] = [None] * len(cases)

    async def one(i: int, prompt: str, n: int) -> None:
        results[i] = await llm.generate(prompt, max_tokens=n, **kw)  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        for i, (prompt, n) in enumerate(cases):
            tg.start_soon(one, i, prompt, n)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def q8_llm(smollm2_path: Path) -> tallow.LLM:
    """The default model with its KV cache in q8_0."""
    return tallow.LLM(smollm2_path, n_ctx=512, kv_dtype="q8_0")


@pytest.fixture(params=["f16", "q8_0"])
def kv_dtype(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def alone_llm(kv_dtype: str, smollm2: tallow.LLM, q8_llm: tallow.LLM) -> tallow.LLM:
    """An LLM whose KV pages are of ``kv_dtype``: each request alone."""
    return q8_llm if kv_dtype == "q8_0" else smollm2


@pytest.mark.anyio
async def test_concurrent_greedy_requests_match_each_alone(
    alone_llm: tallow.LLM, smollm2_path: Path, kv_dtype: str
) -> None:
    cases = prompts(16)
    alone = [alone_llm.generate(p, max_tokens=n, temperature=0).token_ids for p, n in cases]
    async with AsyncLLM(smollm2_path, max_num_seqs=16, kv_dtype=kv_dtype) as llm:
        results = await run_all(llm, cases, temperature=0)
        stats = llm.stats()
    assert [r.token_ids for r in results] == alone
    assert all(r.finish_reason in ("length", "stop") for r in results)
    assert stats["pages_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0


# The long runs use one backend; the short ones above and below cover both.
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_preemption_keeps_outputs_exact(
    alone_llm: tallow.LLM, smollm2_path: Path, kv_dtype: str
) -> None:
    cases = prompts(64)
    alone = [alone_llm.generate(p, max_tokens=n, temperature=0).token_ids for p, n in cases]
    # 12 pages of 8 tokens cannot hold 64 requests of up to ~30 tokens at once.
    async with AsyncLLM(
        smollm2_path, max_num_seqs=64, kv_pages=12, page_size=8, kv_dtype=kv_dtype
    ) as llm:
        results = await run_all(llm, cases, temperature=0)
        stats = llm.stats()
    assert stats["preemptions"] > 0
    assert [r.token_ids for r in results] == alone
    assert stats["pages_used"] == 0


@pytest.mark.anyio
async def test_seeded_sampling_is_independent_of_the_batch(smollm2_path: Path) -> None:
    cases = prompts(8)
    async with AsyncLLM(smollm2_path, max_num_seqs=8) as llm:
        together = await run_all(llm, cases, temperature=0.9, seed=1234)
        alone = [await llm.generate(p, max_tokens=n, temperature=0.9, seed=1234) for p, n in cases]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    # A different seed gives a different text somewhere.
    async with AsyncLLM(smollm2_path, max_num_seqs=8) as llm:
        other = await run_all(llm, cases, temperature=0.9, seed=99)
    assert [r.token_ids for r in other] != [r.token_ids for r in together]


@pytest.mark.anyio
async def test_seeded_draws_are_the_same_on_the_device_and_on_the_host(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampled request's tokens are the same whether its steps draw them on the model's
    device (every request in the step draws from the raw logits) or on the host (beside it a
    request with a logit bias, whose steps copy the logits back)."""
    on_device: list[bool] = []
    drawn_on_device = Engine._drawn_on_device

    def spy(engine: Engine, step: Step) -> bool:
        on_device.append(drawn_on_device(engine, step))
        return on_device[-1]

    monkeypatch.setattr(Engine, "_drawn_on_device", spy)
    prompt = "Once upon a time, in a small village,"
    sampled = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02, "seed": 77}
    async with AsyncLLM(smollm2_path, max_num_seqs=4) as llm:
        alone = await llm.generate(prompt, max_tokens=24, ignore_eos=True, **sampled)  # type: ignore[arg-type]
        assert on_device and all(on_device)
        on_device.clear()
        results: dict[str, GenerationResult] = {}

        async def biased() -> None:
            results["biased"] = await llm.generate(
                "Hello", max_tokens=40, ignore_eos=True, temperature=0.0, logit_bias={11: 1.0}
            )

        async def again() -> None:
            results["sampled"] = await llm.generate(
                prompt, max_tokens=24, ignore_eos=True, **sampled
            )  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg:
            tg.start_soon(biased)
            tg.start_soon(again)
    # The sampled request's 24 tokens came (nearly all) from steps that drew on the host.
    assert on_device.count(False) >= 20, on_device
    assert results["sampled"].token_ids == alone.token_ids
    assert len(set(alone.token_ids)) > 5


@pytest.mark.anyio
async def test_stream_pieces_make_the_completion(smollm2_path: Path) -> None:
    async with AsyncLLM(smollm2_path) as llm:
        whole = await llm.generate("Paris is a city in", max_tokens=12, temperature=0)
        pieces = [p async for p in llm.stream("Paris is a city in", max_tokens=12, temperature=0)]
        stopped = await llm.generate("Paris is a city in", max_tokens=12, temperature=0, stop=" of")
    assert "".join(pieces) == whole.text
    assert stopped.finish_reason == "stop"
    assert whole.text.startswith(stopped.text) and " of" not in stopped.text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cancelling_100_streams_frees_everything(smollm2_path: Path) -> None:
    started = 0

    async with AsyncLLM(smollm2_path, max_num_seqs=32) as llm:

        async def half_way(i: int) -> None:
            nonlocal started
            with anyio.CancelScope() as scope:
                got = 0
                stream = llm.stream(
                    f"Count with me: {i}", max_tokens=40, temperature=0, ignore_eos=True
                )
                async for _ in stream:
                    got += 1
                    if got == 3:
                        started += 1
                        scope.cancel()

        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(half_way, i)
        # Aborts take effect at the engine's next step.
        with anyio.fail_after(30):
            while llm.stats()["running"] or llm.stats()["waiting"] or llm.stats()["pages_used"]:
                await anyio.sleep(0.05)
        stats = llm.stats()
    assert started == 100
    assert (stats["pages_used"], stats["running"], stats["waiting"]) == (0, 0, 0)
    assert stats["finished"] >= 100


@pytest.mark.anyio
async def test_bad_requests(smollm2_path: Path) -> None:
    async with AsyncLLM(smollm2_path, n_ctx=64) as llm:
        with pytest.raises(tallow.InvalidArgumentError):
            await llm.generate("hi", temperature=-1)
        with pytest.raises(tallow.InvalidArgumentError):
            await llm.generate("hi", max_tokens=-2)
        with pytest.raises(tallow.InvalidArgumentError):
            await llm.generate("hi", no_such_option=1)
        with pytest.raises(tallow.ModelError, match="context"):
            await llm.generate("word " * 100)
        with pytest.raises(tallow.InvalidArgumentError, match="token id 49152 is out of range"):
            await llm.generate([1, 2, 49152])
        with pytest.raises(tallow.InvalidArgumentError, match="token id -1"):
            await llm.generate([-1])
        # The engine still serves after bad requests.
        assert (await llm.generate("hi", max_tokens=2, temperature=0)).completion_tokens == 2
    with pytest.raises(tallow.InvalidArgumentError):
        await AsyncLLM(smollm2_path).generate("hi")


@pytest.mark.anyio
async def test_logprobs(smollm2_path: Path) -> None:
    async with AsyncLLM(smollm2_path) as llm:
        plain = await llm.generate("The largest planet", max_tokens=5, temperature=0)
        done = await llm.generate(
            "The largest planet", max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
        )
    assert plain.logprobs is None
    assert done.logprobs is not None and len(done.logprobs) == 5
    assert [lp.token_id for lp in done.logprobs] == done.token_ids == plain.token_ids
    for lp in done.logprobs:
        # Greedy: the chosen token is the most likely one, and log probabilities are <= 0.
        assert lp.top[0][0] == lp.token_id
        assert lp.top[0][1] == pytest.approx(lp.logprob)
        assert 0 >= lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


@pytest.mark.anyio
async def test_tokenize_and_detokenize_as_llm_does(smollm2: tallow.LLM, smollm2_path: Path) -> None:
    text = "Hello <|im_start|> world"
    async with AsyncLLM(smollm2_path) as llm:
        for add, parse in [(True, False), (False, True)]:
            ids = llm.tokenize(text, add, parse)
            assert ids == smollm2.tokenize(text, add, parse)
            assert llm.detokenize(ids) == smollm2.detokenize(ids)
        assert llm.tokenize(text, False, True) != llm.tokenize(text, False, False)
        with pytest.raises(tallow.InvalidArgumentError):
            llm.detokenize([10**9])
        with pytest.raises(tallow.InvalidArgumentError):
            llm.tokenize(b"bytes")  # type: ignore[arg-type]
