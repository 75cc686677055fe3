"""The platform policy (``TRAINPIPE_POLICY``): what each team's specs may use (ADR 0014).

``policy.model`` loads and validates the policy file and finds a spec's team, ``policy.check``
judges a validated spec against its team's rules, ``policy.globs`` (standard library only) matches
names and URIs against the policy's patterns, for the spec stage and for the run-time checks alike.
Nothing is imported here: the run-time checks import ``policy.globs`` alone.
"""

# The policy file (YAML, owned by the platform, outside the specs folder).
POLICY_ENV = "TRAINPIPE_POLICY"
# Without a policy, `training.testing` (fault injection) is refused unless the platform sets this to 1.
FAULT_INJECTION_ENV = "TRAINPIPE_ALLOW_FAULT_INJECTION"
