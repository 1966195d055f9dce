"""Judge-side compaction (``llm.text.compact_trajectory``): the tag skeleton survives, only bodies are elided.

The judge must see the same format defects the strict checker sees (App. C.1, E.3), so compaction may
shorten block bodies but never drop, add or reorder a protocol tag, a ``\\boxed{...}`` or a brace of an answer.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbor.format import check_format, extract_searches
from arbor.llm.text import compact_trajectory, estimate_tokens, parse_trajectory

TAG = re.compile(r"</?(?:think|search|result|answer)>")
MARKER = re.compile(r"\[\.\.\. \d+ tokens elided \.\.\.\]")


def skeleton(text: str) -> list[str]:
    """Protocol tags in order, with every ``\\boxed{`` outside result bodies (tool output is opaque text)."""
    out, in_result = [], False
    for m in re.finditer(r"</?(?:think|search|result|answer)>|\\boxed\{", text):
        tok = m.group(0)
        if tok == "<result>" and not in_result:
            in_result = True
        elif tok == "</result>":
            in_result = False
        if tok.startswith("<") or not in_result:
            out.append(tok)
    return out


def verdict(text: str) -> tuple[bool, str, str | None]:
    r = check_format(text)
    return r.valid, r.reason, r.answer


# ---- generated trajectories: valid ones and every kind of broken one -------------------------------------------

WORDS = ["Paris", "the", "Eiffel", "Tower", "1889", "film", "directed", "by", "Tim", "Burton", "so", "then", "x",
         "(a)", "-", "!", "?", ",", ".", "&", "<", ">", "/", "[", "]"]
WS = [" ", " ", " ", "\n", "\n\n", "\t"]
NOISE = ["{", "}", "\\boxed{", "<think>", "</think>", "<search>", "</search>", "<result>", "</result>", "<answer>",
         "</answer>", "<|im_end|>", "<|endoftext|>", "<thi", "nk>", "\\boxed", "{}", "< search>"]

plain = st.lists(st.sampled_from(WORDS + WS), max_size=25).map("".join)
noisy = st.lists(st.sampled_from(WORDS + WS + NOISE), max_size=25).map("".join)
ws = st.lists(st.sampled_from(["", " ", "\n", "\n\n"]), max_size=3).map("".join)


def long(body: st.SearchStrategy[str], most: int = 40) -> st.SearchStrategy[str]:
    """A body repeated up to ``most`` times, so that budgets actually bite."""
    return st.tuples(body, st.integers(1, most)).map(lambda t: t[0] * t[1])


query = st.one_of(plain.filter(str.strip), st.just(""), st.just("  "))
think = st.builds(lambda b, w: f"<think>{b}</think>{w}", long(plain, 20), ws)


def searches(body: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(lambda q, r, w1, w2: f"<search>{q}</search>{w1}<result>{r}</result>{w2}",
                     query, long(body, 60), ws, ws)


search = searches(st.one_of(plain, noisy))
clean_search = searches(plain)
stray = st.one_of(ws, plain)
boxed_inner = st.one_of(plain, st.just(""), st.just(" "), st.just("a{b}c"), st.just("{x"), st.just("x}"))
answer = st.builds(lambda pre, a, post, w: f"<answer>{pre}\\boxed{{{a}}}{post}</answer>{w}",
                   st.one_of(st.just(""), long(plain, 5)), boxed_inner, st.one_of(st.just(""), plain),
                   st.sampled_from(["", "\n", "<|im_end|>", "\n<|endoftext|>"]))
broken = st.one_of(
    st.builds(lambda t, b: f"<{t}>{b}", st.sampled_from(["think", "search", "result", "answer"]), long(plain, 15)),
    st.sampled_from(["</think>", "</search>", "</result>", "</answer>", "<search>", "<result>"]),  # stray tags
    st.builds(lambda q, b: f"<search>{q}<think>{b}</think></search>", plain, plain),  # nested
    st.builds(lambda q: f"<search>{q}</search>", plain),  # search without result
    st.builds(lambda r: f"<result>{r}</result>", long(plain, 20)),  # result without search
    st.builds(lambda a: f"<answer>{a}</answer>", plain),  # no \boxed
    st.builds(lambda a, b: f"<answer>\\boxed{{{a}}} \\boxed{{{b}}}</answer>", plain, plain),  # two boxed
    answer,  # a second answer
    long(noisy, 10),  # text (and tag fragments) anywhere, e.g. after </answer>
)


@st.composite
def trajectories(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(think, search, search, stray), max_size=6))
    if draw(st.integers(0, 5)):
        parts.append(draw(answer))
    for _ in range(draw(st.integers(0, 2))):
        parts.insert(draw(st.integers(0, len(parts))), draw(broken))
    text = draw(st.sampled_from(["", "", "implicit reasoning </think>\n"])) + "".join(parts)
    if draw(st.integers(0, 7)) == 0:  # truncation: the response stops anywhere
        text = text[: draw(st.integers(0, len(text)))]
    return text


budgets = st.integers(0, 600)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trajectories(), budgets)
def test_compaction_never_changes_the_format_verdict(text: str, budget: int) -> None:
    out = compact_trajectory(text, budget)
    assert verdict(out) == verdict(text)
    assert skeleton(out) == skeleton(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trajectories(), budgets)
def test_compaction_budget_and_identity(text: str, budget: int) -> None:
    out = compact_trajectory(text, budget)
    if estimate_tokens(text) <= budget:
        assert out == text
    else:
        # over budget only when even the skeleton with every body fully elided does not fit
        assert estimate_tokens(out) <= max(budget, estimate_tokens(compact_trajectory(text, 0)))
        assert estimate_tokens(out) <= estimate_tokens(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(think, clean_search, clean_search), min_size=1, max_size=6), answer, budgets)
def test_results_go_first(parts: list[str], ans: str, budget: int) -> None:
    """Reasoning, queries and the answer are cut only once every result body is down to its marker."""
    text = "".join(parts) + ans
    out = compact_trajectory(text, budget)
    before, after = parse_trajectory(text), parse_trajectory(out)
    kept_text = after.of("think") == before.of("think") and extract_searches(out) == extract_searches(text) \
        and after.of("answer") == before.of("answer")
    if not kept_text:
        for r_in, r_out in zip(before.results, after.results, strict=True):
            assert r_out == r_in or MARKER.fullmatch(r_out), (r_in[:80], r_out)


# ---- deterministic cases -------------------------------------------------------------------------------------

LONG_RESULT = "\n".join(f"Doc {k}: " + "the tower was built for the 1889 exposition " * 30 for k in range(10))


def test_unclosed_search_at_the_very_end_stays_invalid() -> None:
    """A response cut off inside its next query: the defect is the last tag, behind a long result."""
    text = ("<think>Find the country first.</think>\n<search>Eiffel Tower country</search>\n<result>\n"
            + LONG_RESULT + "\n</result>\n<search>" + "capital of France and its population history " * 40)
    assert verdict(text) == (False, "unclosed <search>", None)
    out = compact_trajectory(text, 300)
    assert estimate_tokens(out) <= 300
    assert verdict(out) == (False, "unclosed <search>", None)
    assert skeleton(out) == skeleton(text) and MARKER.search(out)


def test_unclosed_think_before_the_answer_stays_invalid() -> None:
    """Cutting reasoning tails used to drop the stray ``<think>`` and hand the judge a clean trajectory."""
    text = ("<search>Eiffel Tower country</search>\n<result>\n" + LONG_RESULT + "\n</result>\n<think>"
            + "France, so the capital is Paris. " * 200 + "\n<answer>\\boxed{Paris}</answer>")
    assert verdict(text)[:2] == (False, "<answer> nested inside <think>")
    out = compact_trajectory(text, 400)
    assert verdict(out) == verdict(text) and out.count("<think>") == 1


def test_result_bodies_are_elided_before_anything_else() -> None:
    thinks = [f"step {i}: " + "reason about the evidence " * 20 for i in range(3)]
    text = "".join(f"<think>{t}</think>\n<search>query {i}</search>\n<result>\n{LONG_RESULT}\n</result>\n"
                   for i, t in enumerate(thinks)) + "<answer>\\boxed{Paris}</answer>"
    out = compact_trajectory(text, 1200)
    assert estimate_tokens(out) <= 1200
    p = parse_trajectory(out)
    assert p.of("think") == thinks and p.queries == ["query 0", "query 1", "query 2"] and p.answer == "Paris"
    assert all(MARKER.search(r) for r in p.results)
    assert all(r.lstrip().startswith("Doc 0:") for r in p.results)  # the top-ranked passage's head stays
    assert verdict(out) == verdict(text) == (True, "", "Paris")


def _response_8192(n_searches: int = 10, docs_per_result: int = 10) -> tuple[str, list[str], list[str]]:
    """A response whose non-result text is exactly 8,192 estimated tokens (32,768 chars), plus long results."""
    queries = [f"query {i}: who designed tower number {i} and when" for i in range(n_searches)]
    result = "\n".join(f"Doc {k}: " + "passage text about towers and designers " * 40 for k in range(docs_per_result))
    frame = "".join(f"<think></think>\n<search>{q}</search>\n<result>\n{{R}}\n</result>\n" for q in queries)
    frame += "<think></think>\n<answer>\\boxed{Gustave Eiffel}</answer>"
    fixed = len(frame.replace("{R}", ""))
    room = 8192 * 4 - fixed
    n_think = n_searches + 1
    thinks = []
    for i in range(n_think):
        size = room // n_think + (1 if i < room % n_think else 0)
        head = f"[think {i}] "
        thinks.append((head + "weighing the retrieved evidence carefully, " * (size // 40 + 1))[:size])
    parts = frame.split("<think></think>")
    text = parts[0] + "".join(f"<think>{t}</think>{rest}" for t, rest in zip(thinks, parts[1:], strict=True))
    non_result = len(text.replace("{R}", ""))
    assert non_result == 8192 * 4
    return text.replace("{R}", result), thinks, queries


def test_qwen3_budget_keeps_every_reasoning_and_query_character() -> None:
    from arbor.config import load_config

    cfg = load_config("qwen3-8b", ["judge.max_judge_tokens=8448"])  # arbor's capped variant (the profiles: null)
    budget = cfg.judge.max_judge_tokens
    assert budget is not None
    text, thinks, queries = _response_8192()
    assert estimate_tokens(text) > budget  # compaction really runs
    out = compact_trajectory(text, budget)
    assert estimate_tokens(out) <= budget
    p = parse_trajectory(out)
    assert p.of("think") == thinks
    assert extract_searches(out) == queries
    assert p.answer == "Gustave Eiffel"
    assert len(p.results) == 10 and all(MARKER.search(r) for r in p.results)
    assert verdict(out) == verdict(text) == (True, "", "Gustave Eiffel")


def test_qwen3_profiles_show_whole_trajectories_within_the_judges_window() -> None:
    """App. E.1 / E.3: no per-trajectory cap; qwen-plus's 129,024 input tokens are the budget.
    Two trajectories as long as the rollout allows fit E.3's prompt whole (never compacted); E.1's four slots and
    A.1's K trajectories, all at their longest, still keep every reasoning, query and answer character (results
    elided only then): each share >= a whole response's non-result text plus its markers."""
    from arbor.config import load_config
    from arbor.llm.text import min_judge_budget
    from arbor.preflight.judges import judge_shares, judge_window_problems

    for profile in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        cfg = load_config(profile)
        assert (cfg.judge.max_judge_tokens, cfg.judge.context_tokens) == (None, 129024), profile
        blocks = max(cfg.rollout.max_searches, cfg.rollout.max_turns - 1)
        need = min_judge_budget(cfg.rollout.max_response_tokens, blocks)
        assert need >= cfg.rollout.max_response_tokens + math.ceil(blocks * 28 / 4)
        shares = judge_shares(cfg.judge, cfg.rollout, cfg.run.method)
        assert [(r, n) for r, (n, _, _) in shares.items()] == \
            [("pairwise", 2), ("induction", 4), ("induction (unlabeled)", cfg.rollout.k)]
        assert shares["pairwise"][1] >= cfg.rollout.max_context_tokens, profile
        assert min(s for _, s, _ in shares.values()) >= need, profile
        assert judge_window_problems(cfg.judge, cfg.rollout, cfg.run.method) == []


def test_a_window_too_small_for_whole_reasoning_is_refused() -> None:
    """The config refuses a derived budget without a window; preflight names the roles a too-small window would
    cut into the reasoning for (a 32k judge: induction's 4 x ~7k and the unlabeled 8 x ~3.5k < 8,272)."""
    from arbor.config import ConfigError, load_config
    from arbor.preflight.judges import judge_window_problems

    with pytest.raises(ConfigError, match=r"judge.max_judge_tokens=null .* needs judge.context_tokens"):
        load_config("qwen3-8b", ["judge.context_tokens=null"])
    small = load_config("qwen3-8b", ["judge.context_tokens=32768"])
    problems = judge_window_problems(small.judge, small.rollout, small.run.method)
    assert [p.split(" shows ")[0] for p in problems] == \
        ["judge.context_tokens=32768: induction", "judge.context_tokens=32768: induction (unlabeled)"]
    assert "less than the 8272" in problems[0]
    capped = load_config("qwen3-8b", ["judge.context_tokens=32768", "judge.max_judge_tokens=8448"])
    assert judge_window_problems(capped.judge, capped.rollout, capped.run.method) == []


def test_under_budget_is_unchanged_and_markers_are_tag_free() -> None:
    text = "<search>q</search>\n<result>\nr\n</result>\n<answer>\\boxed{a}</answer>"
    assert compact_trajectory(text, 1000) == text
    out = compact_trajectory(text.replace("\nr\n", "\n" + "r " * 5000 + "\n"), 50)
    m = MARKER.search(out)
    assert m and not TAG.search(m.group(0)) and "{" not in m.group(0)
