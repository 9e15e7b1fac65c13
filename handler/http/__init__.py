"""`python -m handler --serve`: a local endpoint that speaks RunPod's serverless /v2 REST API
(and its OpenAI-compatible routes) and runs its jobs on the real worker, the way the runpod
SDK's worker loop does: the job store, the job queue, the HTTP routes and server."""
