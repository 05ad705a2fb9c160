"""The API layer both apps' views use: the signed-write protocol as a service (``signed_writes``), what every
organisation endpoint shares (``endpoints``: the caller's organisation, OpenAPI parameters and answers), the
per-organisation throttle, request bodies (``request_bodies``: limits and the strict JSON parser) and the
errors' mapping to 4xx answers (``errors``). A plain package: no models, no views of its own.
"""
