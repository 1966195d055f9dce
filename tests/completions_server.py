"""A small OpenAI-compatible *completions* server on 127.0.0.1 over our transformers decoding loop (for tests).

It implements the request and response fields of vLLM's server as documented at
https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html and defined in vLLM's
``vllm/entrypoints/openai/completion/protocol.py`` (``CompletionRequest``, ``CompletionResponse``,
``CompletionResponseChoice``, ``CompletionLogProbs``), with vLLM's semantics for what the client relies on:

- ``prompt`` may be a list of token ids (used as is) or a string (tokenised);
- ``stop`` strings end generation; ``include_stop_str_in_output`` keeps the stop string in ``text`` (else it is cut);
  ``token_ids`` always hold every sampled token (EOS included);
- ``logprobs`` (int) turns on ``choices[i].logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
  ``text_offset``); ``return_tokens_as_token_ids`` writes tokens as ``"token_id:{id}"``, else as decoded strings;
- ``return_token_ids`` adds ``choices[i].token_ids`` and ``prompt_token_ids``; ``skip_special_tokens`` shapes ``text``;
- ``finish_reason`` is "stop" (stop string or EOS; ``stop_reason`` names the string) or "length".

Stricter than vLLM on purpose: an unknown (e.g. misnamed) field is refused with HTTP 400 instead of vLLM's logged
warning, and so is a missing ``model``/``prompt`` or a wrong model name, so tests fail when our client is wrong.
Every accepted request body is kept in ``server.requests`` (the tests check the turn-prefix property on it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from arbor.tasks.env.agent import GenRequest
from arbor.tasks.env.decoding import eos_token_ids, generate_turns

# CompletionRequest's fields in vLLM (OpenAI fields, then vLLM's sampling and extra parameters).
VLLM_COMPLETION_FIELDS = {
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs", "bad_words", "prompt_embeds",
    "add_special_tokens", "response_format", "structured_outputs", "priority", "request_id", "return_tokens_as_token_ids",
    "return_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs",
}
# Fields this server implements; the others are accepted only at their vLLM default (else 400: not supported here).
SUPPORTED = {
    "model", "prompt", "logprobs", "max_tokens", "n", "seed", "stop", "temperature", "top_p",
    "include_stop_str_in_output", "skip_special_tokens", "return_tokens_as_token_ids", "return_token_ids",
    "add_special_tokens", "request_id", "stream", "echo", "user", "priority", "top_k",
}
_DEFAULTS_OK = {"stream": (False, None), "echo": (False, None), "n": (1,), "priority": (0,), "top_k": (-1, 0, None)}


class BadRequest(ValueError):
    pass


class CompletionsServer:
    """``with CompletionsServer(model, tokenizer, "tiny") as srv: srv.base_url`` (``http://127.0.0.1:PORT/v1``)."""

    def __init__(self, model: Any, tokenizer: Any, served_model: str, host: str = "127.0.0.1", port: int = 0):
        self.model, self.tokenizer, self.served_model = model, tokenizer, served_model
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path == "/v1/models":
                    self._reply(200, {"object": "list", "data": [{"id": server.served_model, "object": "model"}]})
                else:
                    self._reply(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                if self.path != "/v1/completions":
                    self._reply(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                    self._reply(200, server.complete(body))
                except BadRequest as e:
                    self._reply(400, {"error": {"message": str(e), "type": "BadRequestError", "code": 400}})

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> CompletionsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the endpoint

    def validate(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        unknown = sorted(set(body) - VLLM_COMPLETION_FIELDS)
        if unknown:
            raise BadRequest(f"unknown field(s) {unknown} (not in vLLM's CompletionRequest)")
        for key in sorted(set(body) - SUPPORTED):
            raise BadRequest(f"field '{key}' is valid for vLLM but not supported by this test server")
        for key, ok in _DEFAULTS_OK.items():
            if key in body and body[key] not in ok:
                raise BadRequest(f"{key}={body[key]!r} is not supported by this test server")
        if "model" not in body:
            raise BadRequest("missing field 'model'")
        if body["model"] != self.served_model:
            raise BadRequest(f"The model `{body['model']}` does not exist (serving `{self.served_model}`)")
        prompt = body.get("prompt")
        if prompt is None or prompt == "" or prompt == []:
            raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.")
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=body.get("add_special_tokens", True)))
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(
                self.tokenizer) for t in prompt):
            ids = list(prompt)
        else:
            raise BadRequest("prompt must be a string or a single list of token ids in the vocabulary")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0):
            raise BadRequest("`logprobs` must be a non-negative integer")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("`stop` must be a string or a list of strings")
        max_tokens = body.get("max_tokens", 16)
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("`max_tokens` must be a positive integer")
        for key in ("include_stop_str_in_output", "skip_special_tokens", "return_tokens_as_token_ids",
                    "return_token_ids"):
            if key in body and body[key] is not None and not isinstance(body[key], bool):
                raise BadRequest(f"`{key}` must be a boolean")
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        return {"ids": ids, "stop": stop, "max_tokens": max_tokens, "logprobs": logprobs,
                "temperature": 1.0 if temperature is None else float(temperature),
                "top_p": 1.0 if top_p is None else float(top_p),
                "seed": body.get("seed"), "include_stop": bool(body.get("include_stop_str_in_output", False)),
                "skip_special": bool(body.get("skip_special_tokens", True)),
                "as_ids": bool(body.get("return_tokens_as_token_ids")), "ret_ids": bool(body.get("return_token_ids"))}

    def complete(self, body: Any) -> dict[str, Any]:
        r = self.validate(body)
        seed = r["seed"] if r["seed"] is not None else uuid.uuid4().int & 0xFFFF_FFFF
        with self._lock:
            self.requests.append(body)
            gen = generate_turns(
                self.model, [GenRequest(r["ids"], r["max_tokens"], seed)], temperature=r["temperature"],
                top_p=r["top_p"], decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
                stop_strings=r["stop"], eos_ids=self.eos_ids, pad_id=self.pad_id)[0]
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=r["skip_special"])
        stop_reason = None
        hits = [(text.find(s), s) for s in r["stop"] if s in text]
        if hits:
            at, s = min(hits)
            text = text[: at + len(s)] if r["include_stop"] else text[:at]
            stop_reason = s
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish_reason,
                                  "stop_reason": stop_reason}
        if r["logprobs"] is not None:
            tokens = [f"token_id:{t}" if r["as_ids"] else self.tokenizer.decode([t]) for t in gen.token_ids]
            offsets, pos = [], 0
            for t in gen.token_ids:
                offsets.append(pos)
                pos += len(self.tokenizer.decode([t]))
            choice["logprobs"] = {"text_offset": offsets, "token_logprobs": gen.logprobs, "tokens": tokens,
                                  "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, gen.logprobs, strict=True)]}
        if r["ret_ids"]:
            choice["token_ids"] = gen.token_ids
            choice["prompt_token_ids"] = r["ids"]
        n_prompt, n_out = len(r["ids"]), len(gen.token_ids)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.served_model, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}
