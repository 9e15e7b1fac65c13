"""The worker's own code at the runpod SDK's edges: job takes parsed job by job, the
SDK's job loop that stops taking on SIGTERM and drains against a deadline, and the
drain's state that the handler consults."""
