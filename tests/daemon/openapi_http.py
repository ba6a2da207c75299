"""The daemon's OpenAPI document (gpuguard/daemon/openapi.yaml) and raw HTTP exchanges in
the shapes openapi-core validates: a request and its answer as the wire carried them
(http.client, so that a 404 or a 503 is an answer like any other, not an exception)."""

from __future__ import annotations

import copy
import http.client
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict


def document() -> dict[str, Any]:
    """The committed document, as the wheel ships it (package data of gpuguard.daemon)."""
    text = resources.files("gpuguard.daemon").joinpath("openapi.yaml").read_text()
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def api(doc: dict[str, Any] | None = None) -> OpenAPI:
    return OpenAPI.from_dict(copy.deepcopy(doc if doc is not None else document()))


class WireRequest:
    """openapi_core.protocols.Request of a GET (or any method) to `url`."""

    def __init__(self, url: str, method: str = "GET") -> None:
        parts = urlsplit(url)
        self.url = url
        self.host_url = f"{parts.scheme}://{parts.netloc}"
        self.path = parts.path or "/"
        self.target = self.path + (f"?{parts.query}" if parts.query else "")
        self.method = method.lower()
        self.body: bytes | None = None
        self.content_type = ""
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(parse_qsl(parts.query, keep_blank_values=True)),
            header=Headers(), cookie=ImmutableMultiDict())


@dataclass
class WireResponse:
    """openapi_core.protocols.Response: the status, headers and body as received."""

    status_code: int
    headers: Headers
    data: bytes

    @property
    def content_type(self) -> str:
        return str(self.headers.get("Content-Type", "")).lower()

    @property
    def text(self) -> str:
        return self.data.decode()


def exchange(url: str, method: str = "GET", timeout: float = 5.0
             ) -> tuple[WireRequest, WireResponse]:
    request = WireRequest(url, method)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                      timeout=timeout)
    try:
        conn.request(method, request.target)
        answer = conn.getresponse()
        response = WireResponse(answer.status, Headers(answer.getheaders()), answer.read())
    finally:
        conn.close()
    return request, response


def validated(checker: OpenAPI, url: str) -> WireResponse:
    """GET `url`; the request and the answer both validated against the document (an
    exception of openapi-core's names what does not match)."""
    request, response = exchange(url)
    checker.validate_request(request)
    checker.validate_response(request, response)
    return response
