"""POST /tokenize and POST /detokenize, in vLLM's shapes.

/tokenize takes ``{"prompt"}`` (special tokens added as for a completion) or ``{"messages"}``
(rendered by the chat template exactly as a chat request would be, tools and template
arguments included) and returns ``{"count", "max_model_len", "tokens", "token_strs"}``.
/detokenize takes ``{"tokens"}`` and returns ``{"prompt"}``, special tokens kept.
"""
from __future__ import annotations

from aiohttp import web

from .bodies import json_response
from .protocol import parse_detokenize_request, parse_tokenize_request
from .serving import ServedModel


class Tokenization:
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def tokenize(self, request: web.Request) -> web.Response:
        served = self.served
        req = parse_tokenize_request(await request.read())
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        if req.prompt is not None:
            text = req.prompt
        else:
            text = served.chat_format.render(req.messages, req.tools, template_kwargs=req.template_kwargs,
                                             add_generation_prompt=req.add_generation_prompt).text
        tokens = served.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
        token_strs = [served.tokenizer.backend.id_to_token(t) for t in tokens] if req.return_token_strs else None
        return json_response({"count": len(tokens), "max_model_len": served.max_seq_len, "tokens": tokens,
                              "token_strs": token_strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        served = self.served
        req = parse_detokenize_request(await request.read(), served.tokenizer.vocab_size)
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        return json_response({"prompt": served.tokenizer.decode(req.tokens, skip_special_tokens=False)})
