"""A job, whatever its route: the schema (JobSpec) and its route-neutral checks (fields, sampling
values, structured output values, size limits), its engine requests and their stream, the
empty-output retry, and the running context with its end report."""
