"""The worker's `summarize` job: map-reduce over token chunks until the document fits the
context (`core`, which the `summarize` client shares), the job's engine calls (`job`) and
their order among the summarize jobs of one worker (`schedule`)."""
