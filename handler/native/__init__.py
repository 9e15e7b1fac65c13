"""worker-vllm's native job form: its request (`prompt`, `messages` or `summarize` with
`sampling_params`) and its items (text in growing batches, the final item; n > 1 and
logprobs; OUTPUT_FORMAT=worker-vllm). The summarize job's items are handler.summarize's."""
