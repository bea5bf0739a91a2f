"""umT5-XXL in a short-lived child process: the parent side, the worker script and the prompt cache."""
