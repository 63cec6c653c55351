"""How model versions are loaded beyond one plain load: load slots and retries (--model-load-thread-count,
--model-load-retry-count) and namespaces (--model-namespacing); and how they are unloaded (drained, finalized)."""
