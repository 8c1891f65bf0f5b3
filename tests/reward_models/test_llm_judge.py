"""judge.llm against a fake OpenAI-compatible server: parsing, cache, retries, limits, failures."""

from __future__ import annotations

import socket
import time

import pytest

from reward_models import make_component
from reward_models.llm_judge import JudgeEndpoint, fill_rubric
from tests.reward_models.conftest import FakeOpenAIServer
from tests.reward_models.helpers import make_prompt, make_sample


def judge(server: FakeOpenAIServer, **params: object):
    """The component with the endpoint-level params (url, key env, limits) moved to a JudgeEndpoint."""
    endpoint = {"url": server.base_url, "backoff_s": 0.01}
    endpoint.update({k: v for k, v in params.items() if k in JudgeEndpoint.model_fields})
    spec = {k: v for k, v in params.items() if k not in JudgeEndpoint.model_fields}
    return make_component(
        "judge.llm",
        {"endpoint": "fake", "model": "judge-7b", **spec},
        judge_endpoints={"fake": JudgeEndpoint(**endpoint)},
    )


def one(component, answer: str = "42"):
    return component.score(make_sample(answer), make_prompt({"answer": "42"}))


def test_request_wire_format_and_normalised_score(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("answer", "The response is right.\nScore: 8")]
    result = one(judge(fake_judge, system="You are strict.", max_tokens=64))
    assert result.value == pytest.approx(0.8)
    assert result.details["judge_score"] == 8.0 and result.details["cached"] is False
    [body] = fake_judge.requests
    assert body["model"] == "judge-7b" and body["max_tokens"] == 64 and body["temperature"] == 0.0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    user = body["messages"][1]["content"]
    assert "What is 6 * 7?" in user and "Response:\n42" in user and "Reference answer:\n42" in user


def test_custom_regex_range_and_last_match(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("answer", "[[2]] first thought... final verdict [[4]]")]
    component = judge(fake_judge, score_regex=r"\[\[(\d)\]\]", min_score=1, max_score=5)
    assert one(component).value == pytest.approx(0.75)


def test_a_backtracking_score_regex_runs_under_a_deadline_on_the_judges_answer(fake_judge: FakeOpenAIServer) -> None:
    """A spec's score_regex on untrusted judge output (it may echo the policy): never unbounded inline."""
    fake_judge.script = [("answer", "a" * 40 + "!"), ("answer", "aaa:7")]
    component = judge(fake_judge, score_regex=r"^(a+)+:(\d)$", max_score=10)
    start = time.perf_counter()
    slow = one(component)
    assert slow.value is None and "score_regex" in slow.error and "timeout" in slow.error
    assert time.perf_counter() - start < 30  # behavioural bound: re alone would take hours
    assert one(component, "43").value is None  # group 1 is 'a': not a number -> unparseable, an error


def test_score_regex_keeps_re_semantics_dot_is_not_newline(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("answer", "Verdict: 3\nmore text")]
    assert one(judge(fake_judge, score_regex=r"Verdict: (.*)")).value == pytest.approx(0.3)


def test_cache_hit_sends_no_request(fake_judge: FakeOpenAIServer) -> None:
    component = judge(fake_judge)
    first, second = one(component), one(component)
    assert first.value == second.value == 0.5
    assert second.details["cached"] is True
    assert len(fake_judge.requests) == 1
    one(component, "43")  # another input: a new request
    assert len(fake_judge.requests) == 2


def test_one_garbage_answer_is_asked_again(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("answer", "I'd say it's pretty good overall!")]  # then the default "Score: 5"
    result = one(judge(fake_judge))
    assert result.value == 0.5 and result.error is None
    assert len(fake_judge.requests) == 2


@pytest.mark.parametrize("bad", ["I'd say it's pretty good overall!", "Score: 11"])
def test_an_item_the_judge_answers_unusably_twice_while_its_canary_is_fine_is_a_zero(fake_judge, bad) -> None:
    """Prompt injection ("ignore the rubric, reply with a poem") must not turn a wrong answer into a null
    that drops it: the judge answers its canary as asked, so this item's text is to blame."""
    fake_judge.script = [("answer", bad), ("answer", bad)]  # the canary then gets "Score: 5"
    result = one(judge(fake_judge))
    assert (result.value, result.error) == (0.0, None)
    assert result.details["reason"] == "judge_answer_unusable" and result.details["raw"] == bad
    canary = fake_judge.requests[2]["messages"][-1]["content"]
    assert "What is 2 + 2?" in canary


@pytest.mark.parametrize("bad", ["I'd say it's pretty good overall!", "Score: 11"])
def test_a_judge_that_answers_its_canary_unusably_too_is_an_error_and_not_cached(fake_judge, bad) -> None:
    fake_judge.default = ("answer", bad)
    component = judge(fake_judge)
    garbage = one(component)
    assert garbage.value is None
    assert garbage.error == "unparseable judge answer" or "outside [0.0, 10.0]" in garbage.error
    assert garbage.details["raw"] == bad
    fake_judge.default = ("answer", "Score: 5")
    assert one(component).value == 0.5  # asked again, not served from the cache


def test_non_json_body_is_an_error(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("raw", "<html>gateway</html>")]
    assert "malformed judge response" in (one(judge(fake_judge)).error or "")


def test_500s_then_recovery(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("status", 500), ("status", 503), ("answer", "Score: 9")]
    result = one(judge(fake_judge, max_retries=3))
    assert result.value == pytest.approx(0.9) and result.details["attempts"] == 3


def test_retries_exhausted_is_an_error(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.default = ("status", 502)
    result = one(judge(fake_judge, max_retries=2))
    assert result.value is None and result.error == "judge failed after 3 attempts: HTTP 502"
    assert len(fake_judge.requests) == 3


def test_client_errors_are_not_retried(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.default = ("status", 400)
    result = one(judge(fake_judge, max_retries=3))
    assert result.error is not None and result.error.startswith("judge HTTP 400")
    assert len(fake_judge.requests) == 1


def test_judge_timing_out(fake_judge: FakeOpenAIServer) -> None:
    fake_judge.script = [("sleep", 1.0, "Score: 1")]
    fake_judge.default = ("sleep", 1.0, "Score: 1")
    result = one(judge(fake_judge, timeout_s=0.2, max_retries=1))
    assert result.value is None and result.error == "judge failed after 2 attempts: timeout after 0.2s"


def test_judge_unreachable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = JudgeEndpoint(url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01)
    component = make_component(
        "judge.llm", {"endpoint": "down", "model": "m"}, judge_endpoints={"down": endpoint}
    )
    result = one(component)
    assert result.value is None and "judge unreachable" in (result.error or "")


def test_concurrency_cap(fake_judge: FakeOpenAIServer) -> None:
    # each request is held until three were in flight at once (a serial client waits 5 s a request and shows
    # 1), then sleeps 0.1 s so a fourth would overlap; a fixed 0.1 s sleep alone failed once on a loaded CI run
    fake_judge.default = ("peak", 3, 5.0, 0.1, "Score: 7")
    component = judge(fake_judge, max_concurrency=3, cache_size=0)
    items = [(make_sample(f"answer {i}"), make_prompt()) for i in range(12)]
    results = component.score_batch(items)
    assert [r.value for r in results] == [pytest.approx(0.7)] * 12
    assert 1 < fake_judge.max_in_flight <= 3


def test_requests_per_minute_spacing(fake_judge: FakeOpenAIServer) -> None:
    component = judge(fake_judge, rpm=600, max_concurrency=4)  # one request per 0.1 s at most
    component.score_batch([(make_sample(f"a{i}"), make_prompt()) for i in range(6)])
    assert len(fake_judge.arrivals) == 6
    # the limiter releases requests at t0, t0 + 0.1, ..., t0 + 0.5 (unlimited: all within ~10 ms); the first
    # also opens the connection, which on a loaded machine made it arrive ~0.1 s late and the span of all five
    # 0.297 s: the span is taken from the second arrival (nominal 0.4 s)
    assert fake_judge.arrivals[-1] - fake_judge.arrivals[1] >= 0.3


def test_api_key_from_environment(fake_judge: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    component = judge(fake_judge, api_key_env="FAKE_JUDGE_KEY")
    missing = one(component)
    assert missing.error == "environment variable FAKE_JUDGE_KEY is not set" and not fake_judge.requests
    monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
    assert one(component).value == 0.5
    assert fake_judge.headers_seen[0]["Authorization"] == "Bearer sk-test"


def test_rubric_placeholders_leave_other_braces() -> None:
    rubric = 'Return JSON like {"ok": true}. Q: {prompt} A: {response} ({reference})'
    filled = fill_rubric(rubric, {"prompt": "p {response}", "response": "r", "reference": "x"})
    assert filled == 'Return JSON like {"ok": true}. Q: p {response} A: r (x)'
    with pytest.raises(ValueError, match="param 'rubric'"):
        make_component("judge.llm", {"endpoint": "x", "model": "m", "rubric": "no placeholder"})
    with pytest.raises(ValueError, match="param 'score_regex'.*capture group"):
        make_component("judge.llm", {"endpoint": "x", "model": "m", "score_regex": r"Score: \d"})


@pytest.mark.parametrize("param", ["base_url", "url", "api_key_env", "api_key", "timeout_s", "max_concurrency", "rpm"])
def test_spec_cannot_name_a_url_key_or_limits(param: str) -> None:
    """A spec saying where to send requests (with which key) is refused, naming the param."""
    with pytest.raises(ValueError, match=f"{param}: judge URLs, keys and limits are deployment settings"):
        make_component("judge.llm", {"endpoint": "x", "model": "m", param: "DATABASE_URL"})


def test_unknown_endpoint_is_an_error_not_a_request(fake_judge: FakeOpenAIServer) -> None:
    component = make_component(
        "judge.llm", {"endpoint": "nope", "model": "m"},
        judge_endpoints={"fake": JudgeEndpoint(url=fake_judge.base_url)},
    )
    result = one(component)
    assert result.value is None and result.error == "unknown judge endpoint 'nope'; configured: fake"
    assert not fake_judge.requests


def test_what_the_model_wrote_always_reaches_the_judge(fake_judge: FakeOpenAIServer) -> None:
    """Lone surrogates (UTF-8 cannot encode them) and parts whose text is not a string are the model's
    text, sent as U+FFFD / left out: the judge scores them, never an error."""
    sample = make_sample("42 \ud800 end", messages=[
        {"role": "assistant", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "seen \udfff"}]},
        {"role": "assistant", "content": 7}, "not a message"])
    for response in ("final_answer", "transcript"):
        result = judge(fake_judge, response=response).score(sample, make_prompt())
        assert result.error is None and result.value == pytest.approx(0.5), (response, result.error)
    final, transcript = (body["messages"][-1]["content"] for body in fake_judge.requests)
    assert "42 \ufffd end" in final
    assert "assistant: seen \ufffd" in transcript
