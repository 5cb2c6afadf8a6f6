import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The server decodes Flight bodies without a copy, so their buffers are as aligned as
# protobuf's framing left them; Acero's aggregation and join kernels may assume alignment.
# Any test that hands Acero a misaligned buffer fails (Arrow reads this at Acero's first
# check; spawned servers inherit it).
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "error")
