"""Pre-started notebook environments (decision 0013): the placeholder pool (``pool``), the
per-option spawn rates from the demand forecast (``rates``) and the serve loop (``service``)."""

from portal.prestart.pool import KEY_PREFIX, OWNER, PrestartPool, PrestartSpec

__all__ = ["KEY_PREFIX", "OWNER", "PrestartPool", "PrestartSpec"]
