"""The platform policy (``TRAINPIPE_POLICY``): what each team's specs may use (ADR 0014).

``policy.model`` loads and validates the policy file and finds a spec's team, ``policy.check``
judges a validated spec against its team's rules, ``policy.globs`` (standard library only) matches
names and URIs against the policy's patterns, for the spec stage and for the run-time checks alike.
The policy file comes from ``Settings.policy_path``. Nothing is imported here: the run-time checks import ``policy.globs`` alone.
"""
