"""OpenAI-shaped error answers: the only error format the gateway emits."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from starlette.responses import Response


class GatewayError(Exception):
    """An error answered to the client as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self, extra_headers: Mapping[str, str] | None = None) -> Response:
        headers = {**self.headers, **(extra_headers or {})}
        return Response(self.body(), status_code=self.status, media_type="application/json", headers=headers)


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})
