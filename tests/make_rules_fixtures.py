"""Generate the rules-judge fixture trajectories from the shipped corpus (data/offline/hotpotqa_dev100_distractor.json).

Every question and every search result is real: the questions, gold answers and paragraphs (supporting and
distractor) of the shipped HotpotQA dev sample. Only the agent's behaviour is scripted, K = 8 per group:

positive fixture (process differs with outcome), per group
  3 x precise   : one query per supporting entity, answer-bearing paragraph read last, gold answer   (F1 1)
  2 x late_stop : the precise queries, then 2 more searches after the answer is already in hand
                  (a repeat and a distractor), answer padded with a stray word                      (0 < F1 < 1)
  3 x vague     : generic queries built from the question's lower-case words, repeated 1/3, 2/3, 1/2, distractor
                  paragraphs as results, a distractor title as the answer                           (F1 0)
negative fixture (no process difference): all 8 issue the same queries and read the same paragraphs; half
  answer with the gold, half with the title of the answer-bearing paragraph (also in the evidence).

Run ``python tests/make_rules_fixtures.py`` to rewrite tests/data/rules/{positive,negative}.json (deterministic).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arbor.format import check_format  # noqa: E402
from arbor.reward import exact_match, normalize_answer, token_f1  # noqa: E402
from arbor.seeding import derive_seed  # noqa: E402
from arbor.types import Trajectory  # noqa: E402

SOURCE = ROOT / "data" / "offline" / "hotpotqa_dev100_distractor.json"
OUT = ROOT / "tests" / "data" / "rules"
K = 8
N_POSITIVE, N_NEGATIVE = 6, 3


def _paragraphs(item: dict[str, Any]) -> dict[str, str]:
    return {t: "".join(s).strip() for t, s in zip(item["context"]["title"], item["context"]["sentences"], strict=True)}


def _contains(text: str, needle: str) -> bool:
    return re.search(rf"\b{re.escape(normalize_answer(needle))}\b", normalize_answer(text)) is not None


def eligible(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bridge questions whose gold answer (and the title of the paragraph holding it) is in the second supporting
    paragraph and not in the first."""
    out = []
    for item in data:
        if item["type"] != "bridge":
            continue
        paras = _paragraphs(item)
        sup = list(dict.fromkeys(item["supporting_facts"]["title"]))
        if len(sup) != 2 or any(t not in paras for t in sup):
            continue
        with_answer = [t for t in sup if _contains(f"{t}: {paras[t]}", item["answer"])]
        if len(with_answer) != 1:
            continue
        first = next(t for t in sup if t not in with_answer)
        distract = [t for t in paras if t not in sup and not _contains(paras[t], item["answer"])]
        if len(distract) < 4 or token_f1(with_answer[0], item["answer"]) > 0 or _contains(paras[first], with_answer[0]):
            continue
        out.append({"item": item, "first": first, "last": with_answer[0], "distract": distract, "paras": paras})
    return out


def _render(turns: list[tuple[str, str]], answer: str) -> tuple[str, list[str]]:
    parts = ["<think>I need to identify the entities in the question and look them up one at a time.</think>"]
    for query, result in turns:
        parts.append(f"<search>{query}</search>\n<result>\n{result}\n</result>")
    parts.append("<think>The retrieved evidence is enough to answer.</think>")
    parts.append(f"<answer>The answer is \\boxed{{{answer}}}</answer>")
    return "\n".join(parts), [q for q, _ in turns]


def _traj(qid: str, question: str, golds: list[str], group: int, sample: int, text: str, queries: list[str],
          profile: str) -> dict[str, Any]:
    fmt = check_format(text)
    f1 = token_f1(fmt.answer, golds) if fmt.valid else 0.0
    t = Trajectory(
        run_id="fixture", step=0, group=group, sample=sample, question_id=qid, question=question, golds=golds,
        text=text, turns=len(queries) + 1, search_calls=len(queries), search_queries=queries,
        finish_reason="answer", format_valid=fmt.valid, format_reason=fmt.reason, answer=fmt.answer,
        em=exact_match(fmt.answer, golds) if fmt.valid else 0.0, f1=f1, base_reward=f1 if fmt.valid else -1.0,
    )
    row = t.to_row()
    row["profile"] = profile  # fixture-only label (ignored by Trajectory.from_row)
    return row


def _vague_words(question: str) -> str:
    words = [w for w in re.findall(r"[a-z]+", question) if len(w) > 3][:3]
    return " ".join(words) or "answer"


def positive_group(e: dict[str, Any], group: int) -> dict[str, Any]:
    item, paras = e["item"], e["paras"]
    qid, question, golds = item["_id"] if "_id" in item else f"hotpot-{group}", item["question"], [item["answer"]]
    res = {t: f"{t}: {paras[t]}" for t in paras}
    precise = [(e["first"], res[e["first"]]), (e["last"], res[e["last"]])]
    rows = []
    for s in range(K):
        pick = derive_seed("rules-fixture", group, s) % len(e["distract"])
        d1, d2 = e["distract"][pick], e["distract"][(pick + 1) % len(e["distract"])]
        if s < 3:
            profile, turns, answer = "precise", precise, item["answer"]
        elif s < 5:
            profile = "late_stop"
            turns = precise + [(e["first"], res[e["first"]]), (f"{d1} {_vague_words(question)}", res[d1])]
            answer = f"{item['answer']} {d2.split()[0]}"
        else:
            profile = "vague"
            v = _vague_words(question)
            shapes = {5: [v, v, f"{v} information"], 6: [v, v, v], 7: [v, v]}  # graded repetition
            turns = [(q, res[d1] if i % 2 == 0 else res[d2]) for i, q in enumerate(shapes[s])]
            answer = e["distract"][(pick + 2) % len(e["distract"])]
        text, queries = _render(turns, answer)
        rows.append(_traj(qid, question, golds, group, s, text, queries, profile))
    return {"question_id": qid, "question": question, "golds": golds, "trajectories": rows}


def negative_group(e: dict[str, Any], group: int) -> dict[str, Any]:
    item, paras = e["item"], e["paras"]
    qid, question, golds = item.get("_id", f"hotpot-neg-{group}"), item["question"], [item["answer"]]
    turns = [(e["first"], f"{e['first']}: {paras[e['first']]}"), (e["last"], f"{e['last']}: {paras[e['last']]}")]
    rows = []
    for s in range(K):
        answer = item["answer"] if s % 2 == 0 else e["last"]
        text, queries = _render(turns, answer)
        rows.append(_traj(qid, question, golds, group, s, text, queries, "same_process"))
    return {"question_id": qid, "question": question, "golds": golds, "trajectories": rows}


def build() -> dict[str, list[dict[str, Any]]]:
    data = json.loads(SOURCE.read_text(encoding="utf-8"))
    for i, item in enumerate(data):
        item.setdefault("_id", f"hotpotqa-dev-{i}")
    el = eligible(data)
    if len(el) < N_POSITIVE + N_NEGATIVE:
        raise SystemExit(f"{SOURCE}: only {len(el)} eligible questions, need {N_POSITIVE + N_NEGATIVE}")
    return {
        "positive": [positive_group(e, g) for g, e in enumerate(el[:N_POSITIVE])],
        "negative": [negative_group(e, g) for g, e in enumerate(el[N_POSITIVE : N_POSITIVE + N_NEGATIVE])],
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, groups in build().items():
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(groups, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {path} ({len(groups)} groups x {K} trajectories)")


if __name__ == "__main__":
    main()
