"""The exception hierarchy, each class mapped to the status and error body vLLM 0.33 returns.

Every error a handler can meet is one of these; the app turns it into
`{"error": {"message", "type", "param", "code"}}` (vLLM's `ErrorResponse`). Anything else
that escapes a handler is a bug, logged and answered with a 500 in the same shape.

    RenderServiceError
    ├── BadRequestError         400 "BadRequestError"  (handler checks, VLLMValidationError)
    ├── RequestValidationError  400 "Bad Request"      (schema, malformed JSON, content type)
    ├── UnauthorizedError       401 {"error": "Unauthorized"}
    ├── NotFoundError           404 "NotFoundError"    (unknown model)
    ├── ConflictError           409 "ConflictError"    (fingerprint or snapshot mismatch)
    ├── UnprocessableEntityError 422 "UnprocessableEntityError" (a media URL the server refused)
    ├── PayloadTooLargeError    413 "PayloadTooLargeError"
    ├── OverloadedError         503 "ServiceUnavailableError" (+ Retry-After)
    └── TemplateTimeoutError    504 "GatewayTimeoutError"
"""

from __future__ import annotations

from typing import Any


class RenderServiceError(Exception):
    status_code = 500
    error_type = "InternalServerError"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: int | str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = self.status_code if code is None else code
        if error_type is not None:
            self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str] | None:
        return None


class BadRequestError(RenderServiceError):
    status_code = 400
    error_type = "BadRequestError"


class RequestValidationError(RenderServiceError):
    """Schema failures: vLLM answers these through its validation handler."""

    status_code = 400
    error_type = "Bad Request"


class UnauthorizedError(RenderServiceError):
    status_code = 401
    error_type = "Unauthorized"

    def body(self) -> dict[str, Any]:
        return {"error": "Unauthorized"}


class NotFoundError(RenderServiceError):
    status_code = 404
    error_type = "NotFoundError"


class ConflictError(RenderServiceError):
    status_code = 409
    error_type = "ConflictError"


class UnprocessableEntityError(RenderServiceError):
    """vLLM's VLLMUnprocessableEntityError: str() carries parameter and value."""

    status_code = 422
    error_type = "UnprocessableEntityError"


class PayloadTooLargeError(RenderServiceError):
    status_code = 413
    error_type = "PayloadTooLargeError"


class OverloadedError(RenderServiceError):
    status_code = 503
    error_type = "ServiceUnavailableError"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)}


class TemplateTimeoutError(RenderServiceError):
    status_code = 504
    error_type = "GatewayTimeoutError"
