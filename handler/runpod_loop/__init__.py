"""The worker's own RunPod job loop: it overrides the runpod 1.12 SDK's job loop
(`rp_scale.JobScaler`, swapped in for the length of `runpod.serverless.start`) because that
loop parses a job take as one JSON document (one unreadable job loses the whole batch) and,
on SIGTERM, waits for the jobs in flight with no deadline (RunPod's SIGKILL then ends them
silently). Here each job of a take is parsed on its own, and the drain ends at
DRAIN_TIMEOUT_S: the jobs still running fail `worker_shutdown` with their partial text."""
