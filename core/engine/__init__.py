"""The engine: requests as sequences, the scheduler, the step loop, sampling settings,
detokenization, the thread that runs it beside the server, and the offline LLM API."""
