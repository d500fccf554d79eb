"""The models a pass-through request body names, for a team's model allow-list.

A team held to an allow-list must not reach another model through any route: embeddings and
moderations name it in a JSON body, audio transcriptions and image edits in a form field. The
whole body is read as the upstream would read it (JSON may open with any amount of
whitespace; a form may repeat a field), and a body that claims a JSON or form shape but cannot
be read as one is refused: a lenient upstream might still find a model in it.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import orjson
from python_multipart import FormParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import Field, File, MultipartState, parse_options_header

from gateway.errors import GatewayError

_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


def models_named(body: bytes, content_type: str) -> list[str]:
    """Every ``model`` the body names (none for a body without one, such as a file upload)."""
    media = content_type.partition(";")[0].strip().lower()
    if media in _FORMS:
        return _form_models(body, content_type, media)
    if not body.strip():
        return []
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        if "json" in media or body.lstrip()[:1] in (b"{", b"["):
            raise GatewayError(400, "The request body is not valid JSON.") from None
        return []  # neither JSON nor a form: raw bytes, which name no model
    if not isinstance(payload, dict) or "model" not in payload:
        return []
    model = payload["model"]
    if not isinstance(model, str):
        raise GatewayError(400, "'model' must be a string.", param="model")
    return [model]


def _form_models(body: bytes, content_type: str, media: str) -> list[str]:
    if media == "application/x-www-form-urlencoded":
        try:
            fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise GatewayError(400, "The form body is not valid UTF-8.") from None
        return [value for name, value in fields if name == "model"]
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise GatewayError(400, "A multipart/form-data body needs a boundary in its Content-Type.")
    models: list[str] = []

    def on_field(field: Field) -> None:
        if field.field_name == b"model":
            models.append((field.value or b"").decode("utf-8", errors="replace"))

    def on_file(file: File) -> None:
        if file.field_name == b"model":  # a model sent as a file part is still read by the upstream
            file.file_object.seek(0)
            models.append(file.file_object.read().decode("utf-8", errors="replace"))
        file.close()

    # Files stay in memory: the body is already there, within the pass-through body limit.
    parser = FormParser(
        "multipart/form-data",
        on_field,
        on_file,
        boundary=boundary,
        config={"MAX_MEMORY_FILE_SIZE": len(body) + 1, "MAX_BODY_SIZE": len(body) + 1},
    )
    try:
        parser.write(body)
        parser.finalize()
    except (FormParserError, ValueError):
        complete = False
    else:  # a body cut inside a part (a `model` the upstream might read) ends in another state
        complete = getattr(parser.parser, "state", None) == MultipartState.END
    if not complete:
        raise GatewayError(400, "The multipart/form-data body is malformed or incomplete.")
    return models
