"""The API layer both apps' views use.

- ``signed_writes``: the signed-write protocol as one service (``signed_write_handle``);
- ``endpoints``: what every organisation endpoint shares (the caller's organisation, the signed write as an
  HTTP answer, the OpenAPI description of a signed write);
- ``throttles``: one request budget per organisation;
- ``request_bodies``: body limits per endpoint and the strict JSON parser;
- ``errors``: service-layer errors as 4xx answers; ``openapi``: those answers in the schema.

A plain package: no models, no URLs of its own.
"""
