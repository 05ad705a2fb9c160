"""OpenAPI post-processing: the error answers every endpoint can give, documented once for all.

Views document their own successes and specific errors; this adds what the middleware, the parser, the
authentication and the throttles answer on any endpoint, so the schema lists every status code returned.
"""

COMMON = {
    "400": "invalid body, parameter or path (a NUL character, a malformed number): {field: [reason]}",
    "413": "the body is over this endpoint's limit: {detail, limit} (docs/operations.md)",
}
AUTHENTICATED = {
    "401": "no or an unknown token",
    "403": "authenticated, but this organisation or role may not do this",
    "429": "over the organisation's request rate",
}


def document_error_responses(result, generator, request, public):
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            responses = operation.setdefault("responses", {})
            wanted = dict(COMMON)
            if operation.get("security") and {} not in operation["security"]:
                wanted |= AUTHENTICATED
            if "{" in path:
                wanted["404"] = "no such object, or not visible to the caller"
            if any(parameter.get("name") == "cursor" for parameter in operation.get("parameters", [])):
                wanted["404"] = "an invalid page cursor"
            for code, description in wanted.items():
                responses.setdefault(code, {"description": description})
    return result
