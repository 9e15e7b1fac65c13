"""The OpenAI routes as jobs (`openai_route` + `openai_input`, or worker-vllm's route + body):
chat completions, completions and the Responses API read into a JobSpec (fields, sampling,
structured output), and their output objects, stream chunks and events; /v1/models."""
