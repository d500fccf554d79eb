"""The gateway's own error answers: OpenAI-shaped, or Anthropic-shaped on the Messages route."""

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

    def anthropic_body(self) -> bytes:
        return anthropic_error_body(self.message, anthropic_error_type(self.status))

    def response(
        self, extra_headers: Mapping[str, str] | None = None, *, anthropic: bool = False
    ) -> Response:
        headers = {**self.headers, **(extra_headers or {})}
        body = self.anthropic_body() if anthropic else self.body()
        return Response(body, status_code=self.status, media_type="application/json", headers=headers)


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_path(path: str) -> bool:
    """Errors on Anthropic's routes are written in Anthropic's shape, which its SDKs parse."""
    return path.startswith("/v1/messages")


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error_body(message: str, type: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": type, "message": message}})
