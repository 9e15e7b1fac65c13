"""Structured output: a request's tokens constrained to a JSON schema, a regex, a choice
or a grammar. The grammar engine is llguidance (benchmarks/structured_backends.py says
why); its token masks are computed on the host while the device runs the step and are
applied to the logits on the device. Requests without structured_outputs pay nothing."""
