"""The OpenAI-compatible API (--openai-port): chat/text completions, embeddings, models, over the same Engine."""
