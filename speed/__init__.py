"""Speed options (compile, compute precision, attention kernel): resolved per GPU before loading, applied to
each expert after loading. See options.py."""
