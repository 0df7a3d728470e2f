"""The engine: requests as sequences, the scheduler, the step loop (with speculative drafting
and verification), detokenization, the thread that runs it beside the server, and the offline
LLM API."""
