"""Request bodies and raw ASGI responses of the REST front end.

Reading a body within the request limit (declared ``Content-Length`` checked before a byte is
read), its ``Content-Encoding`` (gzip, deflate), Triton's ``Inference-Header-Content-Length``,
and sending a response straight over ASGI (the infer fast path and the transports' early
refusals), with the error bodies the FastAPI exception handler renders.
"""

from __future__ import annotations

import re
import zlib

from fastapi import Request
from starlette.requests import ClientDisconnect

from tierserve.core.errors import InvalidInputError, PayloadTooLargeError

from ..runtime.tensors import dump_json

HEADER_LENGTH = "Inference-Header-Content-Length"
_DIGITS = re.compile(r"[0-9]{1,19}")
INTERNAL_ERROR = {"error": "internal error"}
JSON = b"application/json"
BINARY = b"application/octet-stream"


async def read_body(request: Request, limit: int) -> bytes:
    """The decoded body of a FastAPI request, at most ``limit`` bytes before and after
    decompression (:class:`PayloadTooLargeError` past it)."""
    declared = request.headers.get("content-length")
    check_declared(declared, limit)
    body = await receive_body(request.receive, limit)
    if body is None:
        raise ClientDisconnect()
    return decode_body(body, request.headers.get("content-encoding", ""), limit)


def check_declared(declared: str | None, limit: int) -> None:
    """Refuse a declared ``Content-Length`` that is malformed or over ``limit``."""
    if declared is None:
        return
    if not _DIGITS.fullmatch(declared) or int(declared) > limit:
        raise PayloadTooLargeError(
            f"the request body has {declared[:20]} bytes; the limit is {limit}"
        )


def decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` after its Content-Encoding (gzip, deflate or none)."""
    encoding = encoding.lower().strip()
    if encoding in ("gzip", "deflate"):
        try:
            decomp = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
            body = decomp.decompress(body, limit + 1)
        except zlib.error as exc:
            raise InvalidInputError(f"the {encoding} body cannot be decompressed: {exc}") from None
        if len(body) > limit or decomp.unconsumed_tail:
            raise PayloadTooLargeError(f"the decompressed body exceeds the limit of {limit} bytes")
    elif encoding not in ("", "identity"):
        raise InvalidInputError(f"unsupported Content-Encoding {encoding[:40]!r}")
    return body


def parse_header_length(value: str | None) -> int | None:
    """The JSON header length of a binary-tensor request (None: the whole body is JSON)."""
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):
        raise InvalidInputError(
            f"{HEADER_LENGTH} must be a non-negative integer, got {value[:40]!r}"
        )
    return int(value)


async def receive_body(receive, limit: int) -> bytes | None:
    """The body's bytes as ASGI ``receive`` delivers them; None when the client left."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # http.disconnect
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def error_bytes(body: dict[str, str]) -> bytes:
    """An error body as the FastAPI exception handler's JSONResponse renders it."""
    return dump_json(body)


async def send_response(send, status: int, payload: bytes, media: bytes, json_length=None) -> None:
    """Send a whole response over ASGI (``json_length``: Triton's binary-tensor header)."""
    headers = [(b"content-length", str(len(payload)).encode()), (b"content-type", media)]
    if json_length is not None:
        headers.append((b"inference-header-content-length", str(json_length).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
