import os

from hypothesis import HealthCheck, settings

# `default` keeps the suite fast; `nightly` (HYPOTHESIS_PROFILE=nightly) digs much deeper.
settings.register_profile("default", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
