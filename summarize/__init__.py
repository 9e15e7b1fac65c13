"""The `summarize` batch client (run as `summarize` or `python -m summarize`): documents from
files, folders or JSONL summarized on the local engine (the worker's handler in-process) or a
RunPod endpoint, results appended as they finish, reruns resumed. The worker never imports it."""
