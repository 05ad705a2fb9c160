"""Middleware of the project's own."""

from django.http import JsonResponse

from tlog.chain import LedgerFault


class LedgerFaultMiddleware:
    """A write refused because the log does not extend its own signed checkpoint is a 503, on every page.

    (The API's exception handler says the same for DRF views; this covers the admin and the portal.)
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, LedgerFault):
            return JsonResponse({"detail": f"the ledger refuses writes: {exception}"}, status=503)
        return None
