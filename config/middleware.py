"""Middleware of the project's own."""

from django.http import JsonResponse
from kombu.exceptions import OperationalError as BrokerUnreachable
from redis.exceptions import ConnectionError as RedisUnreachable
from redis.exceptions import TimeoutError as RedisTimeout

from tlog.chain import LedgerFault

# Seconds a client should wait before retrying while the cache or the broker is down.
RETRY_AFTER = 30
OUTAGES = (RedisUnreachable, RedisTimeout, BrokerUnreachable)


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
        if isinstance(exception, OUTAGES):  # Redis (cache, throttles, nonces) or the broker is down: try later
            detail = f"a service this request needs is unreachable ({type(exception).__name__}); retry later"
            response = JsonResponse({"detail": detail}, status=503)
            response["Retry-After"] = str(RETRY_AFTER)
            return response
        return None
