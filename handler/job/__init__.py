"""A job's input and state: the schema (JobSpec), its OpenAI form, value checks,
sampling values, size limits, and the running context with its end report."""
